#!/usr/bin/env bash
# Which of PyTorch's SDPA kernels take the benchmark's attention (32 query heads, 8 key/value
# heads, head dim 128, causal) forward and backward under its deterministic mode: W3's (fp32,
# 2048 tokens) and W2's (bf16 autocast, 4096 tokens), with the grouped heads passed as they are
# (enable_gqa, as transformers does without a mask) and repeated (train_llm.py --attn
# sdpa-repeat-kv). W3's traces show the math kernel's backward (bench/RESULTS.md, session 29).
#   bash scripts/gpu/sdpa-backends.sh            (on the GPU machine; under a minute)
set -euo pipefail
python3 - <<'PY'
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = True
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
BACKENDS = (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH)
for workload, tokens, autocast in (("W3", 2048, False), ("W2", 4096, True)):
    q = torch.randn(1, 32, tokens, 128, device="cuda", requires_grad=True)
    k = torch.randn(1, 8, tokens, 128, device="cuda", requires_grad=True)
    v = torch.randn(1, 8, tokens, 128, device="cuda", requires_grad=True)
    precision = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    for gqa in (True, False):
        kk, vv = (k, v) if gqa else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
        label = f"{workload} {'bf16' if autocast else 'fp32'} enable_gqa={gqa!s:5}"

        def attention():
            with precision:
                out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
            out.float().sum().backward()

        for backend in BACKENDS:
            try:
                with sdpa_kernel(backend):
                    attention()
                torch.cuda.synchronize()
                verdict = "runs forward and backward"
            except Exception as error:  # the kernel refused these inputs: say why
                verdict = "refused: " + str(error).strip().splitlines()[0][:160]
            print(f"{label} {backend.name:20} {verdict}")
        # With every kernel allowed, what the dispatcher picks, from the operators it records.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            attention()
        chosen = sorted({e.key for e in prof.key_averages() if "attention" in e.key or "softmax" in e.key})
        print(f"{label} default dispatch: {', '.join(chosen)}")
PY

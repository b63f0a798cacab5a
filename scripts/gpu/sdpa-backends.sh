#!/usr/bin/env bash
# Which of PyTorch's SDPA kernels take W3's attention (fp32, 32 query heads, 8 key/value heads,
# 2048 tokens, causal) forward and backward under the benchmark's deterministic mode, with the
# grouped heads passed as they are (enable_gqa, as transformers does without a mask) and with
# them repeated. W3's traces show the math kernel's backward (bench/RESULTS.md, session 29).
#   bash scripts/gpu/sdpa-backends.sh            (on the GPU machine; about 20 s)
set -euo pipefail
python3 - <<'PY'
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = True
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
q = torch.randn(1, 32, 2048, 128, device="cuda", requires_grad=True)
k = torch.randn(1, 8, 2048, 128, device="cuda", requires_grad=True)
v = torch.randn(1, 8, 2048, 128, device="cuda", requires_grad=True)
for gqa in (True, False):
    kk, vv = (k, v) if gqa else (k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa).sum().backward()
            torch.cuda.synchronize()
            verdict = "runs forward and backward"
        except Exception as error:  # the kernel refused these inputs: say why
            verdict = "refused: " + str(error).strip().splitlines()[0][:160]
        print(f"enable_gqa={gqa!s:5} {backend.name:20} {verdict}")
    # With every kernel allowed, what the dispatcher picks, from the operators it records.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa).sum().backward()
    chosen = sorted({e.key for e in prof.key_averages() if "attention" in e.key or "softmax" in e.key})
    print(f"enable_gqa={gqa!s:5} default dispatch: {', '.join(chosen)}")
PY

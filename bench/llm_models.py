"""The workloads of bench/train_llm.py and what each mode builds: the model (transformers' Llama, or
teraio.models.gpt for the tiny CPU workload), its batches, its optimizer, and the native peers'
wrappers (checkpointing, selective checkpointing, FSDP2 with CPU offload)."""

import contextlib
import dataclasses
import functools
import importlib.util
import socket

import torch

import repeated_kv  # bench/repeated_kv.py


@dataclasses.dataclass(frozen=True)
class Workload:
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    batch: int
    seq: int
    micro_batches: int
    precision: str  # "bf16-autocast" (fp32 parameters), "fp32-tf32" or "fp32"
    needs_transformers: bool = True


WORKLOADS = {
    "W1": Workload(hidden=2048, layers=16, ffn=5632, heads=16, kv_heads=16, vocab=32000, batch=8, seq=2048,
                   micro_batches=1, precision="bf16-autocast"),
    "W2": Workload(hidden=4096, layers=8, ffn=14336, heads=32, kv_heads=8, vocab=32000, batch=1, seq=4096,
                   micro_batches=16, precision="bf16-autocast"),
    "W3": Workload(hidden=4096, layers=32, ffn=14336, heads=32, kv_heads=8, vocab=128256, batch=1, seq=2048,
                   micro_batches=32, precision="fp32-tf32"),
    "tiny": Workload(hidden=64, layers=2, ffn=128, heads=4, kv_heads=2, vocab=256, batch=2, seq=32, micro_batches=2,
                     precision="fp32", needs_transformers=False),
}

# Outputs the sac mode keeps (matrix products and attention kernels); it recomputes the rest.
SAC_SAVED = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward", "_efficient_attention_forward")
STATE_BYTES_PER_PARAM = 16  # fp32 parameter, gradient and two AdamW moments
LR = 1e-4


@dataclasses.dataclass
class LanguageModel:
    module: torch.nn.Module
    description: str
    blocks: torch.nn.ModuleList  # the decoder layers: the unit of checkpointing and of sharding
    uses_transformers: bool
    # Inputs copied from pinned memory without waiting (see without_host_syncs), instead of
    # from pageable memory, which makes the host wait for the device at every micro-batch.
    pinned_inputs: bool = False

    def loss(self, batch, device):
        if self.uses_transformers:
            ids = self._to(batch, device)
            return self.module(input_ids=ids, labels=ids).loss
        tokens, targets = batch
        return self.module(self._to(tokens, device), self._to(targets, device))

    def _to(self, tensor, device):
        if self.pinned_inputs and device.type == "cuda":
            return tensor.pin_memory().to(device, non_blocking=True)
        return tensor.to(device)


def without_host_syncs(lm, device):
    """Takes the host syncs out of every micro-batch's forward, without changing what is computed.
    There are two: the input ids are copied from pageable memory (the host waits for the device
    each time), and transformers (4.56 and later) checks in a Python `if` whether the position ids
    hold several packed sequences (`.all()` on a device tensor). The inputs are then copied from
    pinned memory without waiting, and the check is skipped: the bench's inputs are one sequence a
    row, for which it answers None anyway. Returns what was done, for the record."""
    lm.pinned_inputs = True
    done = ["inputs copied from pinned memory without waiting" if device.type == "cuda" else "inputs on the CPU"]
    if lm.uses_transformers:
        patched = _skip_packed_sequence_check()
        done.append(f"transformers' packed-sequence check skipped ({', '.join(patched)})" if patched
                    else "this transformers has no packed-sequence check")
    return "; ".join(done)


def _no_packed_sequences(position_ids):
    return None


def _skip_packed_sequence_check():
    """Replaces find_packed_sequence_indices in the transformers modules that call it from
    _preprocess_mask_arguments (which looks it up in its own module); their names."""
    import sys

    importlib.import_module("transformers.masking_utils")  # loads the module where it lives

    patched = []
    for name, module in list(sys.modules.items()):
        if (name.startswith("transformers") and module is not None
                and callable(getattr(module, "find_packed_sequence_indices", None))
                and hasattr(module, "_preprocess_mask_arguments")):
            module.find_packed_sequence_indices = _no_packed_sequences
            patched.append(name)
    return sorted(patched)


def transformers_available():
    return importlib.util.find_spec("transformers") is not None


def llama_config(workload, attn):
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=workload.hidden, num_hidden_layers=workload.layers,
                         num_attention_heads=workload.heads, num_key_value_heads=workload.kv_heads,
                         intermediate_size=workload.ffn, vocab_size=workload.vocab,
                         max_position_embeddings=workload.seq, use_cache=False)
    config._attn_implementation = repeated_kv.implementation(attn)
    return config


def gpt_config(workload):
    from teraio.models import GPTConfig

    return GPTConfig(vocab=workload.vocab, d_model=workload.hidden, layers=workload.layers, heads=workload.heads,
                     seq=workload.seq, batch=workload.batch, tie_weights=False)


GPT_FALLBACK = ("teraio.models.gpt (transformers not installed; GPT blocks: MLP 4 x hidden, no grouped KV heads, "
                "matmul attention)")


def describe_model(attn):
    return f"transformers LlamaForCausalLM ({repeated_kv.describe(attn)})" if transformers_available() else GPT_FALLBACK


def new_language_model(workload, attn):
    """The workload's model, on torch's default device."""
    if transformers_available():
        from transformers import LlamaForCausalLM

        module = LlamaForCausalLM(llama_config(workload, attn))
        return LanguageModel(module, describe_model(attn), module.model.layers, True)
    if workload.needs_transformers:
        raise RuntimeError("this workload needs transformers (pip install transformers); only the tiny workload "
                           "has a built-in fallback model")
    from teraio.models import GPT

    module = GPT(gpt_config(workload))
    return LanguageModel(module, GPT_FALLBACK, module.blocks, False)


def build_model(workload, attn, device):
    """The workload's model, initialised on `device` from seed 0."""
    torch.manual_seed(0)
    with _default_device(device):
        lm = new_language_model(workload, attn)
    lm.module.to(device).train()
    return lm


def _default_device(device):
    # torch < 2.0 (Debian's CPU build) has no device context: its models are built on the CPU anyway.
    return device if hasattr(torch.device, "__enter__") else contextlib.nullcontext()


def count_parameters(workload, attn):
    """Parameters of the workload's model, built on the meta device (no memory) where torch allows."""
    with _default_device(torch.device("meta") if hasattr(torch.device, "__enter__") else torch.device("cpu")):
        module = new_language_model(workload, attn).module
    return sum(p.numel() for p in module.parameters())


def batch_stream(lm, workload):
    """Each step's micro-batches of random tokens, drawn on the CPU from seed 1: the same batches in
    every mode and on every device, however many steps a mode runs."""
    g = torch.Generator().manual_seed(1)

    def draw():
        if lm.uses_transformers:
            return torch.randint(0, workload.vocab, (workload.batch, workload.seq), generator=g)
        from teraio.models import make_batch

        return make_batch(g, workload.batch, workload.seq, workload.vocab)

    while True:
        yield [draw() for _ in range(workload.micro_batches)]


def make_optimizer(module):
    params = [p for p in module.parameters() if p.requires_grad]
    # One param group per parameter, in every mode: TeraIO needs each optimizer operator to touch one
    # parameter (a multi-tensor kernel over all parameters has every model state as its working set,
    # which cannot fit a budget below the model states), and every mode must run the same math so
    # that losses compare bit for bit. With one parameter per group the fused kernel updates one
    # parameter per call.
    groups = [{"params": [p]} for p in params]
    if all(p.is_cuda for p in params):
        return torch.optim.AdamW(groups, lr=LR, fused=True)
    if torch.cuda.is_available():
        # FSDP2's CPU-offloaded parameters: the peer gets its fastest optimizer, the fused CPU
        # kernel over every parameter at once (its math differs from the CUDA kernel's anyway).
        try:
            return torch.optim.AdamW(params, lr=LR, fused=True)
        except (RuntimeError, ValueError):
            pass
    # On a CPU-only machine fused AdamW may not exist (torch 1.13).
    return torch.optim.AdamW(groups, lr=LR, foreach=False)


def enable_checkpointing(lm):
    if lm.uses_transformers:
        lm.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    from torch.utils.checkpoint import checkpoint

    for block in lm.blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def enable_selective_checkpointing(lm):
    """The sac peer: PyTorch's selective activation checkpointing around every decoder layer."""
    import torch.utils.checkpoint as ckpt

    if not hasattr(ckpt, "create_selective_checkpoint_contexts"):
        raise RuntimeError(f"sac needs PyTorch 2.4 or later (selective checkpointing); this is {torch.__version__}")
    saved = {getattr(torch.ops.aten, name) for name in SAC_SAVED if hasattr(torch.ops.aten, name)}

    def policy(ctx, op, *args, **kwargs):
        keep = getattr(op, "overloadpacket", None) in saved
        return ckpt.CheckpointPolicy.MUST_SAVE if keep else ckpt.CheckpointPolicy.PREFER_RECOMPUTE

    def contexts():
        return ckpt.create_selective_checkpoint_contexts(policy)

    for block in lm.blocks:
        block.forward = functools.partial(ckpt.checkpoint, block.forward, use_reentrant=False, context_fn=contexts)


def shard_with_cpu_offload(lm):
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, fully_shard
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in lm.blocks:
        fully_shard(block, offload_policy=policy)
    fully_shard(lm.module, offload_policy=policy)


@contextlib.contextmanager
def single_process_group(device):
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()

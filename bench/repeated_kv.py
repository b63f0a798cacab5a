"""SDPA attention with the key/value heads repeated (`train_llm.py --attn sdpa-repeat-kv`).

Without a mask, transformers hands grouped key/value heads to
`torch.nn.functional.scaled_dot_product_attention` as they are (`enable_gqa=True`). In fp32,
PyTorch has no fused kernel for that: flash and cuDNN attention take only fp16/bf16, and the
memory-efficient kernel does not take grouped heads in every version. So W3 runs the math kernel,
which keeps each layer's fp32 attention weights for the backward (512 MiB per layer and
micro-batch; bench/RESULTS.md, session 29). With the heads repeated first, as transformers does
when a mask is given, the memory-efficient kernel can take the call.

Same values as the grouped call up to the kernel's rounding, not bit for bit: a benchmark that
uses it compares its modes with each other, all run with it.
"""
from __future__ import annotations

CHOICE = "sdpa-repeat-kv"


class _Ungrouped:
    """What transformers' SDPA function reads from an attention module, without
    `num_key_value_groups`: the heads it gets are already repeated."""

    def __init__(self, module):
        self.is_causal = getattr(module, "is_causal", True)


def install():
    """Registers the repeating function in place of transformers' "sdpa" attention, for this process.

    The models keep `_attn_implementation = "sdpa"`, so their masks are still made for SDPA
    (none for plain causal attention).
    """
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    def sdpa_repeated_kv(module, query, key, value, attention_mask, **kwargs):
        groups = query.shape[1] // key.shape[1]
        return sdpa_attention_forward(_Ungrouped(module), query, repeat_kv(key, groups), repeat_kv(value, groups),
                                      attention_mask, **kwargs)

    AttentionInterface.register("sdpa", sdpa_repeated_kv)


def implementation(attn: str) -> str:
    """The transformers attention implementation for the bench's --attn choice (installing the
    repeating function where it asks for it)."""
    if attn != CHOICE:
        return attn
    install()
    return "sdpa"


def describe(attn: str) -> str:
    return "sdpa attention, key/value heads repeated" if attn == CHOICE else f"{attn} attention"

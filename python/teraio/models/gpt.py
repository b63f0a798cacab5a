"""A small GPT in plain PyTorch.

Attention is written with matmul and softmax rather than scaled_dot_product_attention so that
the same code runs on Debian's torch 1.13 (CPU) and on current CUDA builds, and so that every
operator is a deterministic ATen call that TeraIO observes.
"""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    d_model: int = 128
    layers: int = 4
    heads: int = 4
    seq: int = 64
    batch: int = 4
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")


# "small" takes about 0.1-0.3 s per step on two CPU cores; "large" (about 150M parameters)
# is meant for a GPU.
_PRESETS = {
    "tiny": GPTConfig(vocab=128, d_model=32, layers=2, heads=2, seq=16, batch=4),
    "small": GPTConfig(),
    "large": GPTConfig(vocab=8192, d_model=1024, layers=12, heads=16, seq=512, batch=8),
}


def preset(name: str) -> GPTConfig:
    try:
        return _PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r} (known: {', '.join(_PRESETS)})") from None


def preset_names() -> list[str]:
    return list(_PRESETS)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        mask = torch.ones(config.seq, config.seq, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (b, heads, t, head_dim)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.out = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab, config.d_model)
        self.pos = nn.Embedding(config.seq, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok.weight
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or the mean cross-entropy loss when targets are given."""
        t = tokens.shape[1]
        if t > self.config.seq:
            raise ValueError(f"sequence of {t} tokens is longer than the model's {self.config.seq}")
        positions = torch.arange(t, device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    # GPT-2's initialisation: keeps the initial loss near ln(vocab) with tied weights.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def make_batch(generator: torch.Generator, batch: int, seq: int, vocab: int,
               device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens and their next-token targets, drawn on the CPU from `generator` so that
    the same seed gives the same batch on every device."""
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]

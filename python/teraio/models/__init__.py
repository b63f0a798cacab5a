"""Small models in plain PyTorch for the demo and the exactness tests."""
from .gpt import GPT, GPTConfig, make_batch, preset

__all__ = ["GPT", "GPTConfig", "make_batch", "preset"]

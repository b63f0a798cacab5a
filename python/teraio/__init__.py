"""TeraIO: lifetime-aware tensor offloading for training on GPUs that are too small.

`teraio.Session` observes the first training steps, plans which idle tensors move to host
memory or SSDs and when, and carries the plan out on every later step; `teraio.safetensors`
loads and saves checkpoints through the same storage engine; `teraio.recompute` chooses how
many layers to recompute (activation checkpointing) beside offloading; `teraio.recast` makes
the bf16 copies autocast takes of each weight again in the backward pass instead of keeping them,
and with `teraio.remake` the activations that one elementwise operator makes from kept tensors.
"""
import torch  # noqa: F401  (loads libtorch before the native module that links against it)

from . import _native
from ._native import Error, format_bytes, parse_bytes
from . import paged, recast, recompute
from .session import Report, Session

__version__ = "0.1.0"
build = _native.build

__all__ = ["Error", "Report", "Session", "build", "format_bytes", "paged", "parse_bytes", "recast", "recompute"]

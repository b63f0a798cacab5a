"""teraio.recast: the low-precision copies of weights, made again in the backward pass instead of
kept from the forward.

Under `torch.autocast` every matrix product casts its fp32 weight to bf16 (or fp16), and autograd
keeps that copy until the product's backward. In W2 these copies are 3.5 GiB per micro-batch,
over a quarter of its activations, and they live from the forward pass to the backward pass like
every activation: offloading them costs link time, and their birth in the forward pass is too fast
for the link. Making them again costs one cast per weight, which streams 6 bytes per parameter
through device memory (about 0.4 ms for one W2 layer on an H100) and moves nothing over PCIe.

`weights()` does two things while it is entered:
- a saved-tensor hook (`torch.autograd.graph.saved_tensors_hooks`) keeps, for every saved tensor
  that is a dtype conversion of a leaf parameter (or a view of one), the parameter and the recipe
  instead of the tensor; the backward pass casts the parameter again and takes the same view;
- autocast's cache of cast weights is off (`torch.set_autocast_cache_enabled(False)`), since the
  cache would otherwise hold every copy until the autocast region ends, which is where the
  forward pass peaks. Each weight is cast once per forward anyway in a transformer layer.

The cast is PyTorch's own (`Tensor.to`), the same kernel autocast runs, so the values are bit for
bit those kept before. A parameter changed in place between the forward and the backward pass
would make the copy differ: that is detected (the parameter's version counter) and raised.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch


@dataclasses.dataclass
class Recasts:
    """What `weights()` did: copies replaced by a recipe in forward, and cast again in backward."""

    kept_as_recipe: int = 0
    bytes_not_kept: int = 0   # the copies' bytes (each counted once per saving)
    recast: int = 0           # casts the backward pass ran

    def describe(self) -> str:
        from . import _native
        return (f"{self.kept_as_recipe} weight copies ({_native.format_bytes(self.bytes_not_kept)}) kept as recipes, "
                f"{self.recast} cast again in backward")


@dataclasses.dataclass(frozen=True)
class _Recipe:
    parameter: torch.Tensor
    dtype: torch.dtype
    version: int
    size: torch.Size
    stride: tuple
    offset: int
    counts: Recasts


def _copied_parameter(tensor):
    """The leaf parameter `tensor` is a dtype conversion of (or a view of one), else None."""
    base = tensor._base if tensor._is_view() else tensor
    fn = base.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return None, None
    source = fn.next_functions[0][0] if fn.next_functions else None
    parameter = getattr(source, "variable", None)  # AccumulateGrad of a leaf
    if (parameter is None or parameter.dtype == base.dtype or parameter.shape != base.shape
            or parameter.device != base.device or parameter.stride() != base.stride()
            or base.storage_offset() != 0 or parameter.layout != torch.strided):
        return None, None
    return parameter, base


@contextlib.contextmanager
def weights(counts: Recasts | None = None):
    """Within it, the forward pass keeps no cast copy of a weight for the backward pass; see the
    module's text. Enter it around the forward pass (inside or outside `torch.autocast`); the
    backward pass may run after it has been left. Yields the `Recasts` counts (or `counts`)."""
    counts = counts if counts is not None else Recasts()

    def pack(tensor):
        parameter, base = _copied_parameter(tensor)
        if parameter is None:
            return tensor
        counts.kept_as_recipe += 1
        counts.bytes_not_kept += base.numel() * base.element_size()
        return _Recipe(parameter, base.dtype, parameter._version, tensor.size(), tensor.stride(),
                       tensor.storage_offset(), counts)

    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
            yield counts
    finally:
        torch.set_autocast_cache_enabled(previous)


def _unpack(packed):
    if not isinstance(packed, _Recipe):
        return packed
    if packed.parameter._version != packed.version:
        from .session import _error
        raise _error("teraio.recast: a parameter was modified in place between the forward and the backward pass, "
                     "so its cast copy cannot be made again (run the optimizer step after backward, or leave "
                     "teraio.recast.weights() off)", "invalid argument")
    packed.counts.recast += 1
    with torch.no_grad():
        copy = packed.parameter.to(packed.dtype)
    return copy.as_strided(packed.size, packed.stride, packed.offset)

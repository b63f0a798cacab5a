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
would make the copy differ: its version counter catches that, and a swapped `.data` of another
shape or stride, and both are raised; a swapped `.data` of the same layout is not detectable.
Every other saved tensor is kept detached with its version, so that autograd's own check for
in-place changes, which a saved-tensor hook turns off, still raises.

`saved_tensors(weights=..., activations=...)` chooses the kinds of recipe: with `activations`, the
same hook also asks `teraio.remake` about every other saved tensor (only one saved-tensor hook is
in force at a time, so both live in this one).
"""
from __future__ import annotations

import contextlib
import dataclasses
import warnings

import torch

from . import remake


@dataclasses.dataclass
class Recasts:
    """What `weights()` did: copies replaced by a recipe in forward, and cast again in backward."""

    kept_as_recipe: int = 0
    bytes_not_kept: int = 0   # the copies' bytes (each counted once per saving)
    recast: int = 0           # casts the backward pass ran
    # With activations=True (teraio.remake):
    activations: bool = False
    remade: int = 0           # activations kept as recipes (each once, however many nodes saved it)
    remade_bytes: int = 0
    made_again: int = 0       # times the backward pass made one again
    shared: int = 0           # dtype copies served by an equal one kept before
    shared_bytes: int = 0

    def describe(self) -> str:
        from . import _native
        text = (f"{self.kept_as_recipe} weight copies ({_native.format_bytes(self.bytes_not_kept)}) kept as recipes, "
                f"{self.recast} cast again in backward")
        if self.activations:
            text += (f"; {self.remade} activations ({_native.format_bytes(self.remade_bytes)}) kept as recipes, "
                     f"{self.made_again} made again in backward; {self.shared} dtype copies "
                     f"({_native.format_bytes(self.shared_bytes)}) served by an equal one")
        return text


@dataclasses.dataclass(frozen=True)
class _Recipe:
    parameter: torch.Tensor
    dtype: torch.dtype
    version: int               # the parameter's, when the copy was saved
    parameter_layout: tuple    # its size and stride then (a swapped `.data` of another layout is caught)
    size: torch.Size           # the saved view of the copy
    stride: tuple
    offset: int


@dataclasses.dataclass(frozen=True)
class _Kept:
    """Any other saved tensor. Detached, because a saved output that keeps its own grad_fn would
    form a reference cycle no collector frees when the graph goes without a backward; with its
    version, because a saved-tensor hook turns off autograd's own check for in-place changes."""
    tensor: torch.Tensor
    version: int


_cache_warned = False


def _copied_parameter(tensor):
    """The leaf parameter `tensor` is a fresh dtype conversion of (or a plain view of one), else None."""
    if type(tensor) is not torch.Tensor or tensor.is_conj() or tensor.is_neg():
        return None, None  # subclasses and lazy conjugate/negative views: kept as they are
    base = tensor._base if tensor._is_view() else tensor
    fn = base.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0" or base.dtype != tensor.dtype:
        return None, None
    source = fn.next_functions[0][0] if fn.next_functions else None
    parameter = getattr(source, "variable", None)  # AccumulateGrad of a leaf
    if (parameter is None or parameter.dtype == base.dtype or parameter.shape != base.shape
            or parameter.device != base.device or parameter.stride() != base.stride()
            or base.storage_offset() != 0 or parameter.layout != torch.strided
            or base._version != 0):  # a copy changed after the cast is no longer a recast
        return None, None
    return parameter, base


def weights(counts: Recasts | None = None, activations: bool = False):
    """Within it, the forward pass keeps no cast copy of a weight for the backward pass, and with
    `activations`, no activation `teraio.remake` can make again; see the modules' texts. Enter it
    around the forward pass (inside or outside `torch.autocast`); the backward pass may run after
    it has been left. Yields the `Recasts` counts (or `counts`)."""
    return saved_tensors(counts, weights=True, activations=activations)


@contextlib.contextmanager
def saved_tensors(counts: Recasts | None = None, weights: bool = True, activations: bool = False):
    """`weights()` with each kind of recipe chosen: weight copies (`weights`), activations
    (`activations`, teraio.remake)."""
    counts = counts if counts is not None else Recasts()
    counts.activations = counts.activations or activations
    registry = remake.Registry() if activations else None

    def pack(tensor):
        parameter, base = _copied_parameter(tensor) if weights else (None, None)
        if parameter is None:
            return _keep(tensor) if registry is None else remake.recipe_for(tensor, registry, _keep, counts)
        _warn_if_cached()
        counts.kept_as_recipe += 1
        counts.bytes_not_kept += base.numel() * base.element_size()
        return _Recipe(parameter, base.dtype, parameter._version, (tuple(parameter.shape), parameter.stride()),
                       tensor.size(), tensor.stride(), tensor.storage_offset())

    def unpack(packed):
        tensor = _unpack(packed)
        if isinstance(packed, _Recipe):
            counts.recast += 1
        return tensor

    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(previous and not weights)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield counts
    finally:
        torch.set_autocast_cache_enabled(previous)


def _keep(tensor):
    return _Kept(tensor.detach(), tensor._version)


def _warn_if_cached():
    # torch.autocast reads the cache setting when it is constructed: one built before weights()
    # was entered, or given cache_enabled=True, caches the copies again. Still exact, but the
    # copies then live to the end of the autocast region: said once.
    global _cache_warned
    if torch.is_autocast_cache_enabled() and not _cache_warned:
        _cache_warned = True
        warnings.warn("teraio.recast: autocast's cache is on inside recast.weights() (an autocast made before it, "
                      "or cache_enabled=True), so weight copies still live to the end of the autocast region; "
                      "make the autocast context inside weights() or pass cache_enabled=False", stacklevel=3)


def _unpack(packed):
    if isinstance(packed, _Kept):
        remake.refuse_if_changed(packed.tensor, packed.version)
        return packed.tensor
    if isinstance(packed, remake.RemadeView):
        return packed.read()
    if isinstance(packed, remake.SharedCopy):
        packed.saved.check()
        return packed.layout.view(_unpack(packed.first.kept))
    parameter = packed.parameter
    if parameter._version != packed.version or (tuple(parameter.shape), parameter.stride()) != packed.parameter_layout:
        from .session import _error
        raise _error("teraio.recast: a parameter was modified in place between the forward and the backward pass, "
                     "so its cast copy cannot be made again (run the optimizer step after backward, or leave "
                     "teraio.recast.weights() off)", "invalid argument")
    with torch.no_grad():
        copy = parameter.to(packed.dtype)
    return copy.as_strided(packed.size, packed.stride, packed.offset)

"""teraio.remake: activations that are cheap to make again, kept as recipes from forward to backward.

A decoder layer keeps about half of its activation bytes in tensors that one elementwise operator
makes from other tensors autograd keeps anyway. In a Llama MLP, `silu(gate)` and `silu(gate) * up`
are saved beside `gate` and `up` (a W1 layer: 352 MiB of 1.8 GiB); in RMSNorm, the normalized
input `x * rsqrt(mean(x²) + eps)` is saved beside `x` and the `rsqrt`. Making them again in the
backward pass streams a few hundred MiB through device memory (tenths of a millisecond on an H100)
and moves nothing over PCIe, while whole-layer recomputation runs every matrix product again.
And under `torch.autocast` each matrix product casts its activation operand itself, so q, k and v
keep three identical bf16 copies of the same normalized input: one copy serves all three.

The saved-tensor hook of `teraio.recast.saved_tensors(activations=True)` asks `recipe_for` about every
tensor it is given. A recipe refers to the autograd node that made the tensor, and makes the tensor
again from that node's own saved inputs (`node._saved_self`, ...), which go through the same hook
on the way out, so a recipe may rest on another recipe. The producing node's backward runs after
that of every node that saved its output, so its saved inputs are still there when the recipe is
used. The operator is the one the forward pass ran, on the same inputs, so the values are bit for
bit those kept before; the inputs' version counters (kept by the hook) catch in-place changes. A
remade tensor changed in place after it was saved is not refused, as autograd would: the recipe
gives the values the forward pass used.

Which tensors (each a fresh output, or a view of one, never changed in place since):
- the output of `silu` or `gelu` (`SiluBackward0`, `GeluBackward0`), made again from its input;
- the product of two tensors that both require a gradient (`MulBackward0`: only then does autograd
  keep both factors);
- a dtype copy (`ToCopyBackward0`) of a tensor that is not a leaf: kept once, and every later copy
  of the same tensor to the same dtype and layout, while the first is still kept, is the first.
  Autograd records no change to the copied tensor made in place under `torch.no_grad()`, so
  sharing assumes there is none between two copies.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch


def _silu(node):
    return torch.nn.functional.silu(node._saved_self)


def _gelu(node):
    return torch.nn.functional.gelu(node._saved_self, approximate=node._saved_approximate)


def _mul(node):
    return torch.mul(node._saved_self, node._saved_other)


# The node types whose output is remade: the operator the forward pass ran, on the node's saved
# inputs (each read goes through the saved-tensor hook).
_REMADE_BY = {"SiluBackward0": _silu, "GeluBackward0": _gelu, "MulBackward0": _mul}


@dataclasses.dataclass
class _Layout:
    """The saved tensor as a view of the base it came from."""
    size: torch.Size
    stride: tuple
    offset: int

    @staticmethod
    def of(tensor):
        return _Layout(tensor.size(), tensor.stride(), tensor.storage_offset())

    def view(self, base):
        return base.as_strided(self.size, self.stride, self.offset)


@dataclasses.dataclass
class Remade:
    """An elementwise output kept as its producer and made again on each read."""
    node: object               # the autograd node that made it (holds the saved inputs)
    dtype: torch.dtype
    base_size: torch.Size
    base_stride: tuple
    layout: _Layout

    def make(self):
        with torch.no_grad():
            base = _REMADE_BY[type(self.node).__name__](self.node)
        if base.dtype != self.dtype or base.size() != self.base_size or base.stride() != self.base_stride:
            from .session import _error  # here: the session module imports recast, which imports this one
            raise _error(f"teraio.remake: {type(self.node).__name__} made again gave a {base.dtype} "
                         f"{tuple(base.size())} tensor with strides {base.stride()}, not the {self.dtype} "
                         f"{tuple(self.base_size)} with strides {self.base_stride} it made in the forward pass",
                         "internal")
        return self.layout.view(base)


class FirstCopy:
    """The first dtype copy of a tensor, kept (by recast's `keep`), and the node that made the
    tensor: held so that its id names it as long as this copy can be found."""

    def __init__(self, kept, source):
        self.kept = kept
        self.source = source

    def unchanged(self):
        return self.kept.tensor._version == self.kept.version


@dataclasses.dataclass
class SharedCopy:
    """A dtype copy served by the first equal one, in this copy's view."""
    first: FirstCopy
    layout: _Layout


class Registry:
    """The first dtype copies still held, to find equal ones (weak: an entry lives as long as a
    packed copy refers to it)."""

    def __init__(self):
        self._copies = weakref.WeakValueDictionary()

    def first_copy(self, key):
        first = self._copies.get(key)
        return first if first is not None and first.unchanged() else None

    def add(self, key, first):
        self._copies[key] = first


def _base(tensor):
    if type(tensor) is not torch.Tensor or tensor.is_conj() or tensor.is_neg():
        return None  # subclasses and lazy conjugate/negative views: kept as they are
    base = tensor._base if tensor._is_view() else tensor
    if base._version != 0 or base.layout != torch.strided:
        return None  # changed in place since it was made: the node's inputs no longer give it
    return base


def _remade(node):
    kind = type(node).__name__
    if kind not in _REMADE_BY:
        return False
    if kind == "MulBackward0":
        # Autograd keeps each factor only when the other one needs a gradient.
        return all(edge[0] is not None for edge in node.next_functions)
    return True


def _copied_tensor(node):
    """The (node, output) that made the tensor a dtype copy node copies, when it is not a leaf."""
    if type(node).__name__ != "ToCopyBackward0" or not node.next_functions:
        return None
    source, output = node.next_functions[0]
    if source is None or type(source).__name__ == "AccumulateGrad":
        return None  # a leaf's copy: recast's business
    return source, output


def recipe_for(tensor, registry, keep):
    """What to hold for `tensor` instead of the tensor, and what it was: (`Remade`, "remade"),
    (`SharedCopy`, "shared") for a copy an equal one serves, or whatever `keep` (recast's way of
    keeping a tensor) holds, with None."""
    base = _base(tensor)
    node = base.grad_fn if base is not None else None
    if node is None:
        return keep(tensor), None
    if _remade(node):
        return Remade(node, base.dtype, base.size(), base.stride(), _Layout.of(tensor)), "remade"
    copied = _copied_tensor(node)
    if copied is None:
        return keep(tensor), None
    source, output = copied
    key = (id(source), output, base.dtype, base.device, tuple(base.size()), base.stride())
    first = registry.first_copy(key)
    if first is not None:
        return SharedCopy(first, _Layout.of(tensor)), "shared"
    first = FirstCopy(keep(base), source)
    registry.add(key, first)
    return SharedCopy(first, _Layout.of(tensor)), None

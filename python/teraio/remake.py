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
on the way out, so a recipe may rest on another recipe. A tensor several nodes saved is one recipe,
made once and held from the first of their reads to the last (without autocast, q, k and v save
the same normalized input, which would otherwise be made three times over). The producing node's backward runs after
that of every node that saved its output, so its saved inputs are still there when the recipe is
used. The operator is the one the forward pass ran, on the same inputs, so the values are bit for
bit those kept before; the inputs' version counters (kept by the hook) catch in-place changes, and
so does the remade tensor's own while it lives. Writes autograd does not count (through `.data`,
or a raw pointer) are not seen: the recipe gives the values the forward pass made.

Which tensors (each a fresh strided output, or a view of one of the same dtype, never changed in
place since; at most `MAX_DEPTH` recipes deep):
- the output of `silu` or exact `gelu` (`SiluBackward0`, `GeluBackward0`), made again from its input;
- the product of two tensors that both require a gradient (`MulBackward0`: only then does autograd
  keep both factors);
- a dtype copy (`ToCopyBackward0`) of a tensor that is not a leaf: kept once, and every later copy
  of the same tensor to the same dtype and layout, while the first is still kept, is the first.
  Autograd records no change to the copied tensor made in place under `torch.no_grad()`, so
  sharing assumes there is none between two copies.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref

import torch


def _silu(node):
    return torch.nn.functional.silu(node._saved_self)


def _gelu(node):
    return torch.nn.functional.gelu(node._saved_self)


def _mul(node):
    return torch.mul(node._saved_self, node._saved_other)


# The node types whose output is remade: the operator the forward pass ran, on the node's saved
# inputs (each read goes through the saved-tensor hook).
_REMADE_BY = {"SiluBackward0": _silu, "GeluBackward0": _gelu, "MulBackward0": _mul}

# How many recipes one recipe may rest on, one under another. A Llama MLP needs 2 (the product
# rests on silu(gate), which rests on gate); a chain of products t = t * a[i] would otherwise be
# made again from its start on every read (quadratic work, and Python's recursion limit).
MAX_DEPTH = 2


def _error(message):
    from .session import _error as session_error  # here: the session module imports recast, which imports this one
    return session_error(message, "invalid argument")


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


def refuse_if_changed(tensor, version):
    """Autograd's own check, which a saved-tensor hook turns off: a saved tensor changed in place
    since it was saved at `version` cannot serve the backward pass."""
    if tensor._version != version:
        raise _error("teraio.recast: one of the tensors saved for the backward pass was modified by an in-place "
                     f"operation (version {tensor._version}, saved at {version})")


class _Saved:
    """The tensor autograd was given, watched while it lives: changed in place after it was saved,
    autograd would refuse the backward pass, and so does a recipe that stands in for it."""

    def __init__(self, base):
        self._base = weakref.ref(base)
        self._version = base._version

    def check(self):
        base = self._base()
        if base is not None:
            refuse_if_changed(base, self._version)


# How many recipes this thread is making now: what a recipe reads of its node's saved inputs is
# its own read, not one of the reads autograd owes the saved tensor.
class _Making(threading.local):
    depth = 0


_making = _Making()


@dataclasses.dataclass(eq=False)
class Remade:
    """An elementwise output kept as its producer and made again in the backward pass: once for
    all the nodes that saved it (q, k and v each save the normalized input they read), held from
    the first of their reads to the last, as long as the forward pass's tensor would have been."""
    node: object               # the autograd node that made it (holds the saved inputs)
    dtype: torch.dtype
    size: torch.Size
    stride: tuple
    depth: int                 # 1 + the depth of the deepest recipe among the node's inputs
    saved: _Saved
    counts: object             # recast's Recasts: counts each time it is made
    readers: int = 0           # the saves of it whose read has not come yet
    made: torch.Tensor | None = None

    def read(self, layout):
        """The tensor again, in the view `layout` of the saved one."""
        # Checked on every read, as autograd checks every unpack: the forward pass's tensor
        # changed in place between two reads would have failed the second one.
        self.saved.check()
        base = self.made if self.made is not None else self._make()
        if _making.depth == 0:
            self.readers -= 1
        # Held for the reads still to come; one more than there were saves (a second backward with
        # retain_graph) makes it again rather than keep it for good.
        self.made = base if self.readers > 0 else None
        return layout.view(base)

    def _make(self):
        _making.depth += 1
        try:
            with torch.no_grad():
                base = _REMADE_BY[type(self.node).__name__](self.node)
        except RecursionError:
            raise
        except RuntimeError as error:
            if "teraio.re" in str(error):
                raise  # refused by an inner read (an input changed in place): autograd passes it on as is
            # The producer's backward has run and freed its inputs (a backward over part of the
            # graph before this one, without retain_graph), or a checkpointed region refused to
            # give its tensors out twice.
            raise _error(f"teraio.remake: cannot make a saved {type(self.node).__name__} output again, since its "
                         f"inputs are gone ({str(error).splitlines()[0]}); a backward pass over part of the graph "
                         "followed by another, or a producer inside torch.utils.checkpoint, needs "
                         "recast_activations off") from error
        finally:
            _making.depth -= 1
        if base.dtype != self.dtype or base.size() != self.size or base.stride() != self.stride:
            raise _error(f"teraio.remake: {type(self.node).__name__} made again gave a {base.dtype} "
                         f"{tuple(base.size())} tensor with strides {base.stride()}, not the {self.dtype} "
                         f"{tuple(self.size)} with strides {self.stride} it made in the forward pass")
        self.counts.made_again += 1
        return base


@dataclasses.dataclass(eq=False)
class RemadeView:
    """One save of a remade tensor: the recipe, and the view of its output that was saved."""
    remade: Remade
    layout: _Layout

    def read(self):
        return self.remade.read(self.layout)


class FirstCopy:
    """The first dtype copy of a tensor, kept (by recast's `keep`), and the node that made the
    tensor: held so that its id names it as long as this copy can be found."""

    def __init__(self, kept, source):
        self.kept = kept
        self.source = source

    def unchanged(self):
        return self.kept.tensor._version == self.kept.version


@dataclasses.dataclass(eq=False)
class SharedCopy:
    """A dtype copy served by the first equal one, in this copy's view."""
    first: FirstCopy
    layout: _Layout
    saved: _Saved


class Registry:
    """What one entry of the hook has packed: the first dtype copies still held, to find equal ones,
    and the recipes still held by node, for their depth (weak: an entry lives as long as a packed
    object refers to it, and that object holds the node, so a node's id names it meanwhile)."""

    def __init__(self):
        self._copies = weakref.WeakValueDictionary()
        self._remade = weakref.WeakValueDictionary()

    def first_copy(self, key):
        first = self._copies.get(key)
        return first if first is not None and first.unchanged() else None

    def add_copy(self, key, first):
        self._copies[key] = first

    def remade(self, node):
        return self._remade.get(id(node))

    def depth_below(self, node):
        """The depth of the deepest recipe made of one of `node`'s inputs, or of a view of one."""
        below = [self._remade.get(id(_through_views(edge[0]))) for edge in node.next_functions if edge[0] is not None]
        return max([r.depth for r in below if r is not None], default=0)

    def add_remade(self, remade):
        self._remade[id(remade.node)] = remade


# Autograd nodes of views: an input that is a view of a recipe's output rests on that recipe.
_VIEWS = {"ViewBackward0", "ReshapeAliasBackward0", "AsStridedBackward0", "AliasBackward0", "TBackward0",
          "TransposeBackward0", "PermuteBackward0", "ExpandBackward0", "SliceBackward0", "SelectBackward0",
          "NarrowBackward0", "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward2",
          "DiagonalBackward0", "UnfoldBackward0", "SplitBackward0", "SplitWithSizesBackward0", "UnbindBackward0",
          "ViewAsRealBackward0", "ViewAsComplexBackward0"}


def _through_views(node):
    """The node that made the tensor `node`'s view chain starts from."""
    while node is not None and type(node).__name__ in _VIEWS and node.next_functions:
        node = node.next_functions[0][0]
    return node


def _base(tensor):
    if (type(tensor) is not torch.Tensor or tensor.is_conj() or tensor.is_neg()
            or getattr(tensor, "is_nested", False) or tensor.layout != torch.strided):
        return None  # subclasses, lazy conjugate/negative views, nested and sparse tensors: kept
    base = tensor._base if tensor._is_view() else tensor
    if base.dtype != tensor.dtype:
        return None  # a view of another dtype (view_as_real, .view(dtype)): kept
    if base._version != 0:
        return None  # changed in place since it was made: the node's inputs no longer give it
    return base


def _remade(node):
    kind = type(node).__name__
    if kind not in _REMADE_BY:
        return False
    if kind == "MulBackward0":
        # Autograd keeps each factor only when the other one needs a gradient.
        return all(edge[0] is not None for edge in node.next_functions)
    if kind == "GeluBackward0":
        # The tanh approximation's CPU kernel rounds differently with the number of threads.
        return node._saved_approximate == "none"
    return True


def _copied_tensor(node):
    """The (node, output) that made the tensor a dtype copy node copies, when it is not a leaf."""
    if type(node).__name__ != "ToCopyBackward0" or not node.next_functions:
        return None
    source, output = node.next_functions[0]
    if source is None or type(source).__name__ == "AccumulateGrad":
        return None  # a leaf's copy: recast's business
    return source, output


def recipe_for(tensor, registry, keep, counts):
    """What to hold for `tensor` instead of the tensor: a `Remade`, a `SharedCopy`, or whatever
    `keep` (recast's way of keeping a tensor) holds. `counts` (recast's `Recasts`) counts the
    recipes and the copies an equal one serves."""
    base = _base(tensor)
    node = base.grad_fn if base is not None else None
    if node is None:
        return keep(tensor)
    if _remade(node):
        remade = registry.remade(node)
        if remade is None:
            depth = 1 + registry.depth_below(node)
            if depth > MAX_DEPTH:
                return keep(tensor)
            remade = Remade(node, base.dtype, base.size(), base.stride(), depth, _Saved(base), counts)
            registry.add_remade(remade)
            counts.remade += 1
            counts.remade_bytes += base.numel() * base.element_size()
        remade.readers += 1
        return RemadeView(remade, _Layout.of(tensor))
    copied = _copied_tensor(node)
    if copied is None:
        return keep(tensor)
    source, output = copied
    key = (id(source), output, base.dtype, base.device, tuple(base.size()), base.stride())
    first = registry.first_copy(key)
    if first is None:
        first = FirstCopy(keep(base), source)
        registry.add_copy(key, first)
    else:
        counts.shared += 1
        counts.shared_bytes += base.numel() * base.element_size()
    return SharedCopy(first, _Layout.of(tensor), _Saved(base))

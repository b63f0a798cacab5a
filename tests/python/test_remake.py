"""teraio.remake (recast.weights(activations=True)): elementwise activations kept as recipes and
made again in backward, and equal dtype copies kept once, with gradients, losses and optimizer state
bit for bit those of the same training without it, under a session too."""
import contextlib
import pytest
import torch
from torch import nn

import teraio
from same_training import AutocastTrainer, assert_same_training, footprint, graph_nodes, reference
from teraio import recast

FAST = {key: 1e12 for key in ("d2h", "h2d", "ssd_read", "ssd_write")}
VOCAB, HIDDEN, FFN, HEADS, SEQ, BATCH = 64, 32, 80, 2, 16, 4


class RMSNorm(nn.Module):
    """As transformers' LlamaRMSNorm: normalized in fp32, scaled by an fp32 weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x.to(dtype)


class Layer(nn.Module):
    """A Llama decoder layer's shape: q, k and v read the same normalized input, a SiLU-gated MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)
        self.act = nn.SiLU()

    def forward(self, x):
        h = self.norm1(x)
        b, t, d = h.shape
        q, k, v = (p(h).view(b, t, HEADS, d // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / (d // HEADS) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        a = torch.matmul(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), v)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(self.act(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.norm = RMSNorm()
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x)).float()
        return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _batch(generator):
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def Trainer(autocast=True):
    return AutocastTrainer(Llama, _batch, autocast)


def test_training_with_remade_activations_is_exact_and_counts_what_it_did():
    counts = recast.Recasts()
    got = Trainer()
    for _ in range(3):
        got.step(lambda: recast.weights(counts, activations=True))
    assert_same_training(reference(Trainer, 3), got)
    passes = 3 * 2
    layer_passes = passes * len(got.model.layers)
    # Per layer and pass: both norms' normalized input (x * rsqrt), silu(gate), silu(gate) * up;
    # and the final norm's. The backward pass makes each once: silu(gate), made for the product,
    # is held for the product's own node.
    assert counts.remade == 4 * layer_passes + passes and counts.made_again == counts.remade
    # k and v read q's copy of the normalized input, up reads gate's.
    assert counts.shared == 3 * layer_passes
    assert counts.remade_bytes > 0 and counts.shared_bytes > 0
    assert "made again in backward" in counts.describe() and "served by an equal one" in counts.describe()
    assert "made again" not in recast.Recasts().describe()


def test_in_fp32_a_tensor_saved_by_several_nodes_is_one_recipe_made_once_per_backward():
    """Without autocast, q, k and v save the normalized input itself (weight * x * rsqrt), and gate
    and up theirs: one recipe each, made once for all its readers."""
    counts = recast.Recasts()
    got = Trainer(autocast=False)
    for _ in range(2):
        got.step(lambda: recast.weights(counts, activations=True))
    assert_same_training(reference(lambda: Trainer(autocast=False), 2), got)
    passes = 2 * 2
    layer_passes = passes * len(got.model.layers)
    # Per layer and pass: each norm's x * rsqrt and its product with the weight, silu(gate) and the
    # product with up; the final norm's two.
    assert counts.remade == 6 * layer_passes + 2 * passes and counts.made_again == counts.remade
    assert counts.shared == 0


def test_a_recipe_read_again_after_its_last_reader_is_made_anew():
    g = torch.linspace(-2, 2, 8, requires_grad=True)
    u = torch.linspace(1, 3, 8, requires_grad=True)
    counts = recast.Recasts()
    with recast.weights(counts, activations=True):
        m = torch.nn.functional.silu(g) * u  # silu(g) saved once, as a recipe
    node = m.grad_fn
    first = node._saved_self  # its one reader: not held after it
    second = node._saved_self
    assert torch.equal(first, second) and first.data_ptr() != second.data_ptr()
    assert counts.made_again == 2


def _after_forward(activations):
    """After one forward pass of layer 0: whether down's input (silu(gate) * up) is made anew on
    each read instead of held, and from how many distinct storages q, k and v read theirs."""
    trainer = Trainer()
    layer = trainer.model.layers[0]
    tokens, targets = trainer.draw()
    with recast.weights(activations=activations):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = trainer.model(tokens, targets)
    down = _product_of(loss.grad_fn, layer.down.weight)
    first, second = down._saved_self, down._saved_self  # both alive: a fresh one has its own storage
    made_anew = first.data_ptr() != second.data_ptr()
    assert torch.equal(first, second)
    inputs = {_product_of(loss.grad_fn, p.weight)._saved_self.data_ptr() for p in (layer.q, layer.k, layer.v)}
    loss.backward()
    return made_anew, len(inputs)


def _product_of(root, weight):
    """The matrix product node (`mm`) whose second operand is made from `weight`."""
    for fn in graph_nodes(root):
        if type(fn).__name__ != "MmBackward0":
            continue
        operand = fn.next_functions[1][0]  # through the transpose and the cast to the leaf
        while operand is not None and operand.next_functions:
            operand = operand.next_functions[0][0]
        if getattr(operand, "variable", None) is weight:
            return fn
    raise AssertionError("no product of that weight in the graph")


def test_remade_activations_are_not_kept_and_equal_copies_are_kept_once():
    assert _after_forward(False) == (False, 3)
    assert _after_forward(True) == (True, 1)


def _footprint(**recasting):
    run = Trainer()
    with teraio.Session(gpu_budget=None, device="cpu", warmup_steps=1, profile_steps=1, min_tensor_bytes=1,
                        **recasting) as session:
        for _ in range(2):
            with session.step():
                run.step()
        return session.report()["footprint_bytes"]


def test_the_session_sees_less_memory_at_the_peak():
    before, after = _footprint(recast_weights=True), _footprint(recast_weights=True, recast_activations=True)
    # At the loss both layers' activations are alive; of each layer, silu(gate) and the product
    # (bf16, BATCH x SEQ x FFN), the normalized inputs of both norms (fp32) and three bf16 copies
    # of normalized inputs are gone.
    tokens = BATCH * SEQ
    gone = 2 * (2 * tokens * FFN * 2 + 2 * tokens * HIDDEN * 4 + 3 * tokens * HIDDEN * 2)
    assert before - after >= gone, (before, after, gone)


def test_an_activation_changed_in_place_is_kept_as_it_is():
    def grads(around):
        x = torch.arange(8.0, requires_grad=True)
        y = torch.linspace(-1, 1, 8, requires_grad=True)
        with around():
            p = x * y
            with torch.no_grad():
                p.add_(1)  # in place, and its node is still the product's: x * y no longer gives it
            (p * y).sum().backward()
        return x.grad, y.grad

    counts = recast.Recasts()
    want = grads(contextlib.nullcontext)
    got = grads(lambda: recast.weights(counts, activations=True))
    assert counts.remade == 0 and all(torch.equal(w, g) for w, g in zip(want, got))


def test_a_product_with_a_constant_is_kept():
    """Autograd keeps only the constant: there is nothing to make the product again from."""
    counts = recast.Recasts()
    x = torch.randn(8, requires_grad=True)
    with recast.weights(counts, activations=True):
        out = ((x * torch.full((8,), 3.0)) * x).sum()
    out.backward()
    assert counts.remade == 0 and torch.equal(x.grad, 6 * x)


def test_a_session_with_remade_activations_stays_exact(tmp_path):
    want = reference(Trainer, 5)
    got = Trainer()
    with teraio.Session(gpu_budget=footprint(Trainer) // 2, ssd=[tmp_path], ssd_capacity="64MiB", device="cpu",
                        warmup_steps=1, profile_steps=1, bandwidths=FAST, recast_weights=True,
                        recast_activations=True) as session:
        for _ in range(5):
            with session.step():
                got.step()
        counts = session.recasts
        assert counts.activations and counts.remade > 0 and counts.made_again >= counts.remade
        steps = session.report()["steps"]
        assert steps[-1]["phase"] == "planned" and not any(s["diverged"] for s in steps)
        assert sum(s["bytes_offloaded"] for s in steps[-2:]) > 0
    assert_same_training(want, got)


def test_a_remade_activation_changed_in_place_after_it_was_saved_is_refused_as_autograd_would():
    g = torch.linspace(-2, 2, 8, requires_grad=True)
    u = torch.linspace(1, 3, 8, requires_grad=True)
    with recast.weights(activations=True):
        s = torch.nn.functional.silu(g)
        m = s * u  # saves s, as a recipe
        with torch.no_grad():
            s.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        m.sum().backward()


def _same_gradients(forward, expect_remade=None, expect_shared=None):
    """`forward(leaves)` run plainly and under the hook from the same leaves: the same gradients."""
    def grads(around, counts=None):
        torch.manual_seed(1)
        leaves = [torch.randn(8, requires_grad=True) for _ in range(4)]
        with around():
            forward(leaves).backward()
        return [leaf.grad for leaf in leaves]

    counts = recast.Recasts()
    want = grads(contextlib.nullcontext)
    got = grads(lambda: recast.weights(counts, activations=True))
    for w, g in zip(want, got):
        assert (w is None and g is None) or torch.equal(w, g)
    if expect_remade is not None:
        assert counts.remade == expect_remade, counts
    if expect_shared is not None:
        assert counts.shared == expect_shared, counts
    return counts


def test_a_view_of_a_remade_tensor_keeps_its_offset_and_strides():
    # The product is saved as a strided slice (offset 1, stride 2) of a 2 x 4 view.
    _same_gradients(lambda v: ((v[0] * v[1]).view(2, 4)[:, 1::2] * v[2].view(2, 4)[:, :2]).sum(), expect_remade=1)


def test_views_of_another_dtype_are_kept():
    def complex_view(v):
        h = v[0] * v[1]
        return (torch.view_as_complex(h.double().view(4, 2)) * v[2][:4].to(torch.complex128)).abs().sum()

    def real_view(v):
        p = v[0].to(torch.complex64) * v[1].to(torch.complex64)
        return (torch.view_as_real(p) * v[2].view(8, 1)).sum()

    _same_gradients(complex_view, expect_shared=0)
    _same_gradients(real_view)


def test_copies_of_different_outputs_of_one_node_are_not_shared():
    def halves(v):
        first, second = (v[0] * v[1]).chunk(2)
        return (first.double() * v[2][:4].double()).sum() + (second.double() * v[3][:4].double()).sum()

    _same_gradients(halves, expect_shared=0)


def test_a_copy_changed_in_place_does_not_serve_later_ones():
    def grad_of_second(around):
        torch.manual_seed(1)
        x, w1, w2 = (torch.randn(8, requires_grad=True) for _ in range(3))
        with around():
            h = x * 2
            first = h.double()
            held = (first * w1.double()).sum()  # saves the first copy, and holds it
            with torch.no_grad():
                first.mul_(2)
            second = (h.double() * w2.double()).sum()  # a copy equal to what the first was
        return torch.autograd.grad(second, w2)[0], held

    counts = recast.Recasts()
    want, _ = grad_of_second(contextlib.nullcontext)
    got, _ = grad_of_second(lambda: recast.weights(counts, activations=True))
    assert torch.equal(got, want) and counts.shared == 0


def test_the_tanh_gelu_is_kept():
    _same_gradients(lambda v: (torch.nn.functional.gelu(v[0] * v[1], approximate="tanh") * v[2]).sum(),
                    expect_remade=1)  # the product inside, not the GELU


def test_a_long_chain_of_products_is_made_again_at_most_two_deep():
    def chain(v):
        t = v[0]
        for i in range(300):
            t = t * (v[1] * 1e-3 + 1)  # every factor needs a gradient: each product could be a recipe
        return t.sum()

    counts = _same_gradients(chain)
    # Two of every three products are recipes; the third is kept, so no read recurses deeper.
    assert 190 <= counts.remade <= 210 and counts.made_again <= 2 * counts.remade


def test_a_second_backward_over_the_rest_of_the_graph_says_why_it_fails():
    g = torch.linspace(-2, 2, 8, requires_grad=True)
    u = torch.linspace(1, 3, 8, requires_grad=True)
    with recast.weights(activations=True):
        s = torch.nn.functional.silu(g)
        m = s * u
    s.sum().backward()  # silu's backward runs and frees its input
    with pytest.raises(RuntimeError, match="needs recast_activations off"):
        torch.autograd.grad(m.sum(), u)


def test_an_activation_changed_in_place_between_two_reads_is_refused_as_autograd_would():
    """The second reader of a recipe held for it is checked too, not only the first."""
    def backward(around):
        g = torch.linspace(-2, 2, 8, requires_grad=True)
        u1, u2 = torch.linspace(1, 3, 8, requires_grad=True), torch.linspace(0, 1, 8, requires_grad=True)
        with around():
            s = torch.nn.functional.silu(g)
            a, b = s * u1, s * u2  # both save s; b's node runs first

        def change_s(grad):
            with torch.no_grad():
                s.add_(100)  # after b's read, before a's
            return grad

        a.register_hook(change_s)
        (a + b).sum().backward()

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward(contextlib.nullcontext)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        backward(lambda: recast.weights(activations=True))


def test_a_chain_of_products_through_views_is_made_again_at_most_two_deep():
    def chain(v):
        t = v[0] * v[1]
        for i in range(400):
            t = t.view(2, 4).view(8) * (v[2] * 1e-3 + 1)  # each product's input: a view of the last one
        return t.sum()

    counts = _same_gradients(chain)
    assert 250 <= counts.remade <= 290 and counts.made_again == counts.remade


def test_an_input_changed_before_the_backward_pass_is_named_as_the_cause():
    g, u = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    with recast.weights(activations=True):
        loss = ((torch.nn.functional.silu(g) * u) * u).sum()  # the product rests on silu(g), which rests on g
    with torch.no_grad():
        g.add_(1)  # an optimizer step before the backward pass
    with pytest.raises(RuntimeError, match="modified by an in-place operation") as raised:
        loss.backward()
    assert "recast_activations off" not in str(raised.value)

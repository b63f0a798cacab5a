"""bench/repeated_kv.py (`train_llm.py --attn sdpa-repeat-kv`) against stand-ins for the two
transformers entry points it uses: transformers is not installed here, and the point is the glue
(which name it registers, what the SDPA function then receives)."""
import pathlib
import sys
import types

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import repeated_kv  # noqa: E402


def fake_transformers(monkeypatch):
    registered, calls = {}, []

    class AttentionInterface:
        @classmethod
        def register(cls, key, fn):
            registered[key] = fn

    def repeat_kv(x, n_rep):  # transformers' own: each key/value head n_rep times in a row
        return x.repeat_interleave(n_rep, dim=1)

    def sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs):
        calls.append(dict(module=module, query=query, key=key, value=value, mask=attention_mask, kwargs=kwargs))
        return "out", None

    top = types.ModuleType("transformers")
    top.AttentionInterface = AttentionInterface
    integrations = types.ModuleType("transformers.integrations")
    sdpa = types.ModuleType("transformers.integrations.sdpa_attention")
    sdpa.repeat_kv, sdpa.sdpa_attention_forward = repeat_kv, sdpa_attention_forward
    for name, module in (("transformers", top), ("transformers.integrations", integrations),
                         ("transformers.integrations.sdpa_attention", sdpa)):
        monkeypatch.setitem(sys.modules, name, module)
    return registered, calls


def test_other_choices_pass_through_and_register_nothing(monkeypatch):
    registered, _ = fake_transformers(monkeypatch)
    assert repeated_kv.implementation("sdpa") == "sdpa"
    assert repeated_kv.implementation("eager") == "eager"
    assert registered == {}
    assert repeated_kv.describe("sdpa") == "sdpa attention"


def test_the_sdpa_slot_gets_a_function_that_repeats_the_heads_first(monkeypatch):
    registered, calls = fake_transformers(monkeypatch)
    assert repeated_kv.implementation(repeated_kv.CHOICE) == "sdpa"  # masks stay SDPA's
    assert list(registered) == ["sdpa"]
    assert "repeated" in repeated_kv.describe(repeated_kv.CHOICE)

    class Attention:  # a Llama attention module: 4 query heads share each key/value head
        num_key_value_groups = 4
        is_causal = False

    query = torch.randn(1, 8, 5, 3)
    key = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(1, 2, 5, 3)
    value = key + 100
    assert registered["sdpa"](Attention(), query, key, value, None, dropout=0.0, scaling=0.5) == ("out", None)
    (call,) = calls
    assert call["key"].shape == (1, 8, 5, 3) and call["value"].shape == (1, 8, 5, 3)
    assert torch.equal(call["key"][:, 3], key[:, 0]) and torch.equal(call["key"][:, 4], key[:, 1])
    assert torch.equal(call["value"][:, 7], value[:, 1])
    assert call["query"] is query and call["mask"] is None
    assert call["kwargs"] == {"dropout": 0.0, "scaling": 0.5}
    # Without num_key_value_groups transformers neither repeats again nor asks for enable_gqa;
    # the module's causal flag still reaches it.
    assert not hasattr(call["module"], "num_key_value_groups")
    assert call["module"].is_causal is False

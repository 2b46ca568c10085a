"""The reference GPT: parameter names, init, numerics against a direct
implementation of docs/semantics.md's attention, config validation."""

import math

import pytest
import torch

from mapp.config import ConfigError, normalize_config
from mapp.reference import GPT

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
            vocab_size=64, micro_batch_size=2)


def cfg(**kw):
    return {**BASE, **kw}


def expected_names(c):
    c = normalize_config(c)
    gpt = c["variant"] == "gpt"
    names = ["wte.weight"] + (["wpe.weight"] if gpt else [])
    for l in range(c["num_layers"]):
        p = f"layers.{l}."
        norm = lambda n: [p + n + ".weight"] + ([p + n + ".bias"] if gpt else [])
        lin = lambda n: [p + n + ".weight"] + ([p + n + ".bias"] if gpt else [])
        names += norm("ln1") + lin("attn.qkv") + lin("attn.proj") + norm("ln2")
        names += lin("mlp.fc1") + lin("mlp.fc2") if gpt else \
            lin("mlp.gate") + lin("mlp.up") + lin("mlp.down")
    names += ["ln_f.weight"] + (["ln_f.bias"] if gpt else [])
    if not c["tie_embeddings"]:
        names.append("lm_head.weight")
    return names


def batch(c, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = (c["micro_batch_size"], c["seq_length"])
    return (torch.randint(0, c["vocab_size"], shape, generator=g, dtype=torch.int32),
            torch.randint(0, c["vocab_size"], shape, generator=g, dtype=torch.int32))


VARIANTS = [("gpt", True), ("gpt", False), ("llama", True), ("llama", False)]


@pytest.mark.parametrize("variant,tied", VARIANTS)
def test_names_loss_and_grads(variant, tied):
    c = cfg(variant=variant, tie_embeddings=tied)
    m = GPT(c)
    assert list(m.state_dict().keys()) == expected_names(c)
    assert [n for n, _ in m.named_parameters()] == expected_names(c)
    loss = m(*batch(c))
    assert loss.shape == () and torch.isfinite(loss)
    # At init the logits are near zero: loss near ln(V).
    assert abs(loss.item() - math.log(64)) < 0.3
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_init_rule_and_determinism():
    a, b, c = GPT(cfg(), seed=3), GPT(cfg(), seed=3), GPT(cfg(), seed=4)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q)
        if p.dim() >= 2:
            assert not torch.equal(p, r)
            assert abs(p.std().item() - 0.02) < 0.01
        elif n.endswith(".bias"):
            assert (p == 0).all()
        else:
            assert (p == 1).all()


def naive_attention(q, k, v, heads, scale, causal, rotary_base=None):
    """docs/semantics.md's attention, written per head and per position."""
    b, t, h = q.shape
    d = h // heads
    out = torch.zeros_like(q)
    for hd in range(heads):
        cols = slice(hd * d, hd * d + d)
        qh, kh, vh = q[:, :, cols].clone(), k[:, :, cols].clone(), v[:, :, cols]
        if rotary_base is not None:
            for x in (qh, kh):
                for pos in range(t):
                    for i in range(d // 2):
                        th = pos * rotary_base ** (-2 * i / d)
                        a, c = x[:, pos, i].clone(), x[:, pos, i + d // 2].clone()
                        x[:, pos, i] = a * math.cos(th) - c * math.sin(th)
                        x[:, pos, i + d // 2] = c * math.cos(th) + a * math.sin(th)
        s = scale * qh @ kh.transpose(1, 2)
        if causal:
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        out[:, :, cols] = torch.softmax(s, -1) @ vh
    return out


@pytest.mark.parametrize("variant", ["gpt", "llama"])
def test_attention_matches_semantics(variant):
    c = normalize_config(cfg(variant=variant, rotary_base=500.0))
    attn = GPT(c).layers[0].attn
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        q, k, v = attn.qkv(x).split(32, dim=2)
        o = naive_attention(q, k, v, 4, 1 / math.sqrt(8), True,
                            500.0 if variant == "llama" else None)
        torch.testing.assert_close(attn(x), attn.proj(o), rtol=1e-5, atol=1e-5)


def test_loss_is_next_token_cross_entropy():
    c = cfg(num_layers=1)
    m = GPT(c)
    tokens, targets = batch(c)
    with torch.no_grad():
        x = m.wte(tokens) + m.wpe.weight
        x = m.layers[0](x)
        logits = m.ln_f(x) @ m.wte.weight.t()
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1).long())
        torch.testing.assert_close(m(tokens, targets), want)


@pytest.mark.parametrize("change,key", [
    (dict(num_layers=None), "num_layers"),
    (dict(num_attention_heads=3), "num_attention_heads"),
    (dict(variant="bert"), "variant"),
    (dict(hidden_sz=3), "hidden_sz"),
    (dict(seq_length=0), "seq_length"),
    (dict(vocab_size="big"), "vocab_size"),
    (dict(tie_embeddings=1), "tie_embeddings"),
    (dict(dtype="bfloat16"), "dtype"),
    (dict(variant="llama", hidden_size=36, num_attention_heads=4), "num_attention_heads"),
    (dict(n_layer=2), "n_layer"),  # alias of a key already given
])
def test_config_errors_name_the_key(change, key):
    c = cfg(**change)
    c = {k: v for k, v in c.items() if v is not None}
    with pytest.raises(ConfigError, match=f"'{key}'"):
        normalize_config(c)


def test_config_defaults_and_aliases():
    c = normalize_config({"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 8,
                          "vocab_size": 50257, "make_vocab_size_divisible_by": 128,
                          "_comment": "ignored"})
    assert c["num_layers"] == 1 and c["hidden_size"] == 16 and c["ffn_hidden_size"] == 64
    assert c["vocab_size"] == 50304 and c["tie_embeddings"] is True
    assert normalize_config(cfg(variant="llama"))["tie_embeddings"] is False

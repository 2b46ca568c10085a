"""Each probe reduction and perturbation of the runtime (through the
mapp-probe-check tool, which calls the same code as the kernels) against
numpy/torch on the same tensor."""

import json
import math
import subprocess

import numpy as np
import pytest
import torch

from conftest import require_tool
from scope_ref import normal, sketch_matrix, step_key, uniform


def check(req):
    r = subprocess.run([require_tool("mapp-probe-check")], input=json.dumps(req),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


RNG = np.random.default_rng(5)
X = RNG.standard_normal((2, 5, 12)).astype(np.float32)
X[0, 0, :3] = 0.0  # some exact zeros for sparsity


def reduce(attrs, x=X):
    out = check({"op": "reduce", "attrs": attrs, "shape": list(x.shape),
                 "x": x.reshape(-1).tolist()})
    return {s["reduction"]: s for s in out}


@pytest.mark.parametrize("tokens", [None, [0, 3, 4]])
def test_scalar_reductions(tokens):
    attrs = {"probe_id": 0, "reduce": "max,min,mean,std,absmax,sparsity", "eps": 0.3}
    sel = X
    if tokens:
        attrs["tokens"] = tokens
        sel = X[:, tokens, :]
    got = reduce(attrs)
    v = sel.astype(np.float64).reshape(-1)
    want = {"max": v.max(), "min": v.min(), "mean": v.mean(), "std": v.std(),
            "absmax": np.abs(v).max(), "sparsity": (np.abs(v) < 0.3).mean()}
    for k, w in want.items():
        assert got[k]["value"] == pytest.approx(w, rel=1e-6, abs=1e-7), k


def test_histogram_matches_numpy():
    got = reduce({"probe_id": 0, "reduce": "hist", "bins": 7, "lo": -1.0, "hi": 1.0})
    want, _ = np.histogram(X.astype(np.float64), bins=7, range=(-1.0, 1.0))
    assert got["hist"]["data"] == want.tolist()
    assert got["hist"]["shape"] == [7]


def test_topk_values_and_indices():
    got = reduce({"probe_id": 0, "reduce": "topk", "k": 5, "tokens": [4]})
    sel = X[:, [4], :].reshape(-1)
    idx = np.argsort(-sel, kind="stable")[:5]
    assert got["topk"]["index"] == idx.tolist()
    assert np.allclose(got["topk"]["data"], sel[idx])
    t = torch.topk(torch.from_numpy(sel), 5)
    assert np.allclose(got["topk"]["data"], t.values.numpy())


def test_sketch_is_a_seeded_random_projection():
    got = reduce({"probe_id": 0, "reduce": "sketch", "dim": 4, "seed": 9,
                  "tokens": [1, 2]})
    rows = X[:, [1, 2], :].reshape(-1, 12).astype(np.float64)
    want = rows @ sketch_matrix(9, 4, 12).T
    assert got["sketch"]["shape"] == [4, 4]
    assert np.allclose(np.array(got["sketch"]["data"]).reshape(4, 4), want, atol=1e-5)


def test_raw_is_capped():
    got = reduce({"probe_id": 0, "reduce": "raw", "cap": 10})
    assert np.allclose(got["raw"]["data"], X.reshape(-1)[:10])


@pytest.mark.parametrize("rotary", [False, True])
def test_attention_probabilities_match_torch(rotary):
    b, t, h, heads = 2, 6, 8, 2
    d = h // heads
    q = RNG.standard_normal((b, t, h)).astype(np.float32)
    k = RNG.standard_normal((b, t, h)).astype(np.float32)
    attrs = {"probe_id": 0, "reduce": "attn", "heads": heads, "scale": 1 / math.sqrt(d),
             "causal": 1, "tokens": [1, 5]}
    if rotary:
        attrs.update(rotary=1, rotary_base=10000.0)
    got = check({"op": "attn", "attrs": attrs, "shape": [b, t, h],
                 "q": q.reshape(-1).tolist(), "k": k.reshape(-1).tolist()})
    qt = torch.from_numpy(q[0]).double().view(t, heads, d).transpose(0, 1)
    kt = torch.from_numpy(k[0]).double().view(t, heads, d).transpose(0, 1)
    if rotary:
        from mapp.reference import Rotary
        cos, sin = Rotary(d, 10000.0).tables(t, "cpu")
        rot = Rotary(d, 10000.0)
        qt, kt = rot(qt, cos.double(), sin.double()), rot(kt, cos.double(), sin.double())
    s = qt @ kt.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(s, -1)[:, [1, 5], :]
    assert got["shape"] == [heads, 2, t]
    assert np.allclose(np.array(got["data"]).reshape(heads, 2, t), want.numpy(), atol=1e-6)


def perturb(attrs, x, **kw):
    req = {"op": "perturb", "attrs": {"switch_id": 0, **attrs}, "shape": list(x.shape),
           "x": x.reshape(-1).tolist(), **kw}
    return np.array(check(req), dtype=np.float32).reshape(x.shape)


def test_offset_mask_and_switch_off():
    x = X[0]
    assert np.array_equal(perturb({"kind": "offset"}, x, magnitude=0.5),
                          (x + np.float32(0.5)))
    y = perturb({"kind": "mask", "channels": [1, 7]}, x)
    want = x.copy()
    want[:, [1, 7]] = 0
    assert np.array_equal(y, want)
    assert np.array_equal(perturb({"kind": "gaussian"}, x, magnitude=3.0, enabled=False), x)


def test_gaussian_and_uniform_follow_the_counter_rng():
    x = X[0]
    key = step_key(42, 3, 1)
    n = range(x.size)
    g = perturb({"kind": "gaussian", "seed": 42}, x, magnitude=0.1, step=3, microbatch=1)
    want = x.reshape(-1).astype(np.float64) + 0.1 * np.array([normal(key, i) for i in n])
    assert np.allclose(g.reshape(-1), want, atol=1e-6)
    u = perturb({"kind": "uniform", "seed": 42}, x, magnitude=0.2, step=3, microbatch=1)
    want = x.reshape(-1) * (0.8 + 0.4 * np.array([uniform(key, i) for i in n]))
    assert np.allclose(u.reshape(-1), want, atol=1e-6)
    # Another step draws other noise.
    g2 = perturb({"kind": "gaussian", "seed": 42}, x, magnitude=0.1, step=4, microbatch=1)
    assert not np.allclose(g, g2)


def test_bitflip_flips_the_drawn_bits():
    x = X[0]
    key = step_key(1, 0, 0)
    y = perturb({"kind": "bitflip", "seed": 1, "p": 0.3}, x)
    bits = x.reshape(-1).view(np.uint32).copy()
    for i in range(bits.size):
        if uniform(key, 2 * i) < 0.3:
            bits[i] ^= np.uint32(1 << int(uniform(key, 2 * i + 1) * 32))
    assert np.array_equal(y.reshape(-1).view(np.uint32), bits)


def test_int8_and_fp8_round_trips():
    x = X[0]
    y = perturb({"kind": "int8"}, x)
    s = np.float32(np.abs(x).max()) / np.float32(127)
    want = np.clip(np.round(x / s), -127, 127).astype(np.float32) * s
    assert np.allclose(y, want, atol=1e-7)
    v = np.array([[0.3, -500.0, 1e-4, 0.0, 1.0625, 3.1]], dtype=np.float32)
    # e4m3: 0.3 -> 0.3125, saturate at 448, 1e-4 -> 0 (below half the
    # smallest subnormal 2^-9), 1.0625 ties to even 1.0, 3.1 -> 3.0.
    got = perturb({"kind": "fp8"}, v)
    assert got.tolist() == [[0.3125, -448.0, 0.0, 0.0, 1.0, 3.0]]


def test_bad_attributes_are_rejected():
    r = subprocess.run([require_tool("mapp-probe-check")], input=json.dumps(
        {"op": "reduce", "attrs": {"probe_id": 0, "reduce": "median"}, "shape": [2],
         "x": [1, 2]}), capture_output=True, text=True)
    assert r.returncode == 1 and "unknown reduction 'median'" in r.stderr

"""A short CPU training run with probes: the SQLite store holds every probe x
sampled step x rank, and the values match PyTorch re-computing the same
reductions from the same weights and batches (mapp.reference.GPT + AdamW)."""

import json
import math
import sqlite3

import numpy as np
import pytest
import torch

from mapp import safetensors
from mapp.reference import GPT
from scope_ref import TINY, compile_plan, export, sketch_matrix, train

STEPS = 4
SPEC = {"probes": [
    {"name": "layers.*.mlp.fc1", "reduce": ["max", "mean", "std", "hist"],
     "bins": 8, "range": [-1, 1], "every": 2},
    {"name": "logits", "reduce": ["topk", "absmax"], "k": 4, "tokens": "last"},
    {"name": "layers.1.attn.probs", "reduce": ["attn"], "tokens": [0, -1]},
    {"name": "layers.*", "reduce": ["sketch"], "dim": 4, "seed": 3},
    {"name": "grad:layers.0.mlp.fc1", "reduce": ["std", "sparsity"], "eps": 1e-6},
    {"name": "grad:layers.1.attn.proj.weight", "reduce": ["absmax"]},
]}


def torch_run(tmp, batches):
    """Per step: the tensors each probe observes, recorded with hooks."""
    model = GPT(TINY)
    model.load_state_dict(safetensors.load(tmp / "init.safetensors")[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    seen = []
    for batch in batches:
        rec = {}
        hooks = []

        def keep(name, grad=False):
            def hook(mod, inp, out):
                rec[name] = out.detach().clone()
                if grad:
                    out.register_hook(lambda g: rec.__setitem__("grad:" + name, g.clone()))
            return hook
        for l, layer in enumerate(model.layers):
            hooks.append(layer.mlp.fc1.register_forward_hook(
                keep(f"layers.{l}.mlp.fc1", grad=(l == 0))))
            hooks.append(layer.register_forward_hook(keep(f"layers.{l}")))
            hooks.append(layer.attn.qkv.register_forward_hook(keep(f"layers.{l}.attn.qkv")))
        hooks.append(model.lm_head.register_forward_hook(keep("logits")))
        tokens = torch.tensor(batch["tokens"], dtype=torch.long)
        targets = torch.tensor(batch["targets"], dtype=torch.long)
        opt.zero_grad()
        model(tokens, targets).backward()
        rec["grad:layers.1.attn.proj.weight"] = model.layers[1].attn.proj.weight.grad.clone()
        for h in hooks:
            h.remove()
        seen.append(rec)
        opt.step()
    return seen


def attn_probs(qkv, heads, rows):
    b, t, h3 = qkv.shape
    h = h3 // 3
    d = h // heads
    q = qkv[0, :, :h].double().view(t, heads, d).transpose(0, 1)
    k = qkv[0, :, h:2 * h].double().view(t, heads, d).transpose(0, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1)[:, rows, :]


def test_store_holds_every_sample_and_matches_torch(tmp_path):
    export(tmp_path)
    plan = compile_plan(tmp_path, SPEC)
    db = tmp_path / "probes.sqlite"
    metrics, batches = train(tmp_path, plan, STEPS, "--probe-db", db)
    seen = torch_run(tmp_path, batches)

    con = sqlite3.connect(db)
    probes = {pid: (point, reduce.split(","), every) for pid, point, reduce, every in
              con.execute("SELECT probe_id, point, reduce, every FROM probes")}
    assert sorted(p[0] for p in probes.values()) == sorted([
        "layers.0.mlp.fc1", "layers.1.mlp.fc1", "logits", "layers.1.attn.probs",
        "layers.0", "layers.1", "grad:layers.0.mlp.fc1",
        "grad:layers.1.attn.proj.weight"])
    # Every probe x reduction x sampled step x rank, exactly once.
    ranks = [r for (r,) in con.execute("SELECT rank FROM ranks")]
    assert ranks == [0]
    for pid, (point, reds, every) in probes.items():
        for red in reds:
            steps = [s for (s,) in con.execute(
                "SELECT step FROM samples WHERE probe_id=? AND reduction=? "
                "AND rank=0 AND dp=0 AND pp=0 AND tp=0 ORDER BY step", (pid, red))]
            assert steps == list(range(0, STEPS, every)), (point, red)
    # Step metrics for the training view.
    losses = [l for (l,) in con.execute("SELECT loss FROM steps ORDER BY step")]
    assert losses == pytest.approx([m["loss"] for m in metrics])

    def sample(point, red, step):
        row = con.execute(
            "SELECT s.value, s.data, s.idx, s.shape FROM samples s JOIN probes p "
            "ON p.probe_id=s.probe_id AND p.run_id=s.run_id WHERE p.point=? AND "
            "s.reduction=? AND s.step=?", (point, red, step)).fetchone()
        value, data, idx, shape = row
        data = np.frombuffer(data, dtype=np.float32) if data else None
        idx = np.frombuffer(idx, dtype=np.int64) if idx else None
        return value, data, idx, json.loads(shape)

    for step in range(STEPS):
        rec = seen[step]
        if step % 2 == 0:
            for l in range(2):
                v = rec[f"layers.{l}.mlp.fc1"].double()
                assert sample(f"layers.{l}.mlp.fc1", "max", step)[0] == pytest.approx(v.max().item(), rel=1e-4)
                assert sample(f"layers.{l}.mlp.fc1", "mean", step)[0] == pytest.approx(v.mean().item(), rel=1e-3, abs=1e-6)
                assert sample(f"layers.{l}.mlp.fc1", "std", step)[0] == pytest.approx(v.std(unbiased=False).item(), rel=1e-4)
                hist = np.histogram(v.numpy(), bins=8, range=(-1, 1))[0]
                got = sample(f"layers.{l}.mlp.fc1", "hist", step)[1]
                assert np.abs(got - hist).sum() <= 2  # values on a bin edge may round apart
        last = rec["logits"][:, -1, :].reshape(-1)
        _, vals, idx, _ = sample("logits", "topk", step)
        assert np.allclose(vals, torch.topk(last, 4).values.numpy(), atol=1e-5)
        assert sample("logits", "absmax", step)[0] == pytest.approx(last.abs().max().item(), rel=1e-5)
        _, probs, _, shape = sample("layers.1.attn.probs", "attn", step)
        assert shape == [2, 2, 8]
        want = attn_probs(rec["layers.1.attn.qkv"], 2, [0, 7])
        assert np.allclose(probs.reshape(2, 2, 8), want.numpy(), atol=1e-5)
        for l in range(2):
            _, sk, _, shape = sample(f"layers.{l}", "sketch", step)
            rows = rec[f"layers.{l}"].reshape(-1, 16).double().numpy()
            assert np.allclose(sk.reshape(shape), rows @ sketch_matrix(3, 4, 16).T, atol=1e-4)
        g = rec["grad:layers.0.mlp.fc1"].double()
        assert sample("grad:layers.0.mlp.fc1", "std", step)[0] == pytest.approx(g.std(unbiased=False).item(), rel=1e-3)
        gw = rec["grad:layers.1.attn.proj.weight"]
        assert sample("grad:layers.1.attn.proj.weight", "absmax", step)[0] == pytest.approx(gw.abs().max().item(), rel=1e-3)


def test_probes_without_a_store_change_nothing(tmp_path):
    export(tmp_path)
    plain = compile_plan(tmp_path, None, name="plain")
    probed = compile_plan(tmp_path, SPEC, name="probed")
    a, _ = train(tmp_path, plain, 3, tag="plain")
    b, _ = train(tmp_path, probed, 3, "--probe-db", tmp_path / "x.sqlite", tag="probed")
    assert [m["loss"] for m in a] == [m["loss"] for m in b]
    assert [m["grad_norm"] for m in a] == [m["grad_norm"] for m in b]


def test_corrupt_database_is_a_clear_error(tmp_path):
    import subprocess
    from conftest import require_tool
    export(tmp_path)
    plan = compile_plan(tmp_path, SPEC)
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    r = subprocess.run([require_tool("mapp-run"), plan, "--data", "x", "--tokenizer", "bytes",
                        "--steps", "1", "--probe-db", bad], capture_output=True, text=True)
    assert r.returncode == 1
    assert "probe db" in r.stderr and "not a mapp probe database" in r.stderr
    r = subprocess.run([require_tool("mapp-scope"), "get", "--db", bad, "/api/runs"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not a mapp probe database" in r.stderr

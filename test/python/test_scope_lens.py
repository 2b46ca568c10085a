"""Logit lens (`lens` probe): every layer's residual stream through the final
norm and the unembedding, top-k tokens and probabilities per position,
checked against PyTorch on the same weights; bad specs are clear errors."""

import json
import sqlite3
import subprocess

import numpy as np
import pytest
import torch

from mapp import safetensors
from mapp.reference import GPT
from conftest import require_tool
from scope_ref import TINY, compile_plan, export, run

K = 5
PROMPT = "The m"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """One export for the module (exporting dominates each test's time)."""
    d = tmp_path_factory.mktemp("lens")
    export(d)
    return d


def reference_lens(model, tokens):
    """[layers, T, K] top-k ids and probabilities of ln_f + lm_head per layer."""
    out = []
    with torch.no_grad():
        x = model.wte(tokens) + model.wpe.weight[:tokens.shape[1]]
        for layer in model.layers:
            x = layer(x)
            p = torch.softmax(model.lm_head(model.ln_f(x))[0], -1)
            out.append(torch.topk(p, K))
    return out


@pytest.mark.parametrize("cache", [True, False])
def test_lens_matches_pytorch(model_dir, cache):
    tmp_path = model_dir
    plan = compile_plan(tmp_path, name=f"lens{int(cache)}", spec={"probes": [
        {"name": "layers.*", "reduce": ["lens"], "k": K}]})
    db = tmp_path / f"lens{int(cache)}.sqlite"
    run([require_tool("mapp-run"), plan, "--generate", "--prompt", PROMPT,
         "--max-new-tokens", 1, "--greedy", "--weights",
         tmp_path / "init.safetensors", "--tokenizer", "bytes",
         "--probe-db", db, "--quiet"] + ([] if cache else ["--no-kv-cache"]))
    model = GPT(TINY)
    model.load_state_dict(safetensors.load(tmp_path / "init.safetensors")[0])
    model.eval()
    # The forward sees the prompt padded with token 0 to seq_length.
    T = TINY["seq_length"]
    toks = list(PROMPT.encode()) + [0] * (T - len(PROMPT))
    ref = reference_lens(model, torch.tensor([toks]))

    con = sqlite3.connect(db)
    probes = dict(con.execute("SELECT probe_id, point FROM probes"))
    assert sorted(probes.values()) == ["layers.0", "layers.1"]
    rows = con.execute("SELECT probe_id, shape, data, idx FROM samples "
                       "WHERE reduction='lens' AND step=0").fetchall()
    assert len(rows) == 2
    for pid, shape, data, idx in rows:
        layer = int(probes[pid].split(".")[1])
        assert json.loads(shape) == [T, K]
        p = np.frombuffer(data, np.float32).reshape(T, K)
        ids = np.frombuffer(idx, np.int64).reshape(T, K)
        assert (ids == ref[layer].indices.numpy()).all()
        assert np.abs(p - ref[layer].values.numpy()).max() <= 1e-5


def test_lens_selected_positions(model_dir):
    tmp_path = model_dir
    plan = compile_plan(tmp_path, name="lenssel", spec={"probes": [
        {"name": "layers.1", "reduce": ["lens"], "k": 3, "tokens": [1, -1]}]})
    db = tmp_path / "lenssel.sqlite"
    run([require_tool("mapp-run"), plan, "--generate", "--no-kv-cache", "--prompt",
         "abcdefgh", "--max-new-tokens", 1, "--weights",
         tmp_path / "init.safetensors", "--probe-db", db, "--quiet"])
    model = GPT(TINY)
    model.load_state_dict(safetensors.load(tmp_path / "init.safetensors")[0])
    ref = reference_lens(model.eval(), torch.tensor([list(b"abcdefgh")]))[1]
    shape, data, idx = sqlite3.connect(db).execute(
        "SELECT shape, data, idx FROM samples WHERE reduction='lens'").fetchone()
    assert json.loads(shape) == [2, 3]
    ids = np.frombuffer(idx, np.int64).reshape(2, 3)
    assert (ids == ref.indices[[1, 7], :3].numpy()).all()
    p = np.frombuffer(data, np.float32).reshape(2, 3)
    assert np.abs(p - ref.values[[1, 7], :3].numpy()).max() <= 1e-5
    # mapp-scope serves it per layer with the selected positions.
    run_id = sqlite3.connect(db).execute("SELECT id FROM runs").fetchone()[0]
    got = json.loads(run([require_tool("mapp-scope"), "get", "--db", db,
                          f"/api/lens?run={run_id}&step=0&phase=generate"]).stdout)
    assert [g["point"] for g in got] == ["layers.1"]
    rows = got[0]["rows"]
    assert [r["position"] for r in rows] == [1, 7]
    assert [[t["id"] for t in r["top"]] for r in rows] == ids.tolist()
    assert np.abs(np.array([[t["p"] for t in r["top"]] for r in rows]) - p).max() < 1e-7
    bad = subprocess.run([require_tool("mapp-scope"), "get", "--db", db,
                          f"/api/lens?run={run_id}&step=x"], capture_output=True, text=True)
    assert "must be an integer" in bad.stdout + bad.stderr


@pytest.mark.parametrize("entry,message", [
    ({"name": "layers.0.mlp.fc1", "reduce": ["lens"]}, "'lens' needs a residual stream"),
    ({"name": "layers.0", "reduce": ["lens", "mean"]}, "'lens' is the only reduction"),
    ({"name": "layers.0", "reduce": ["lens"], "k": 0}, "k"),
])
def test_lens_bad_spec(model_dir, tmp_path, entry, message):
    (tmp_path / "spec.json").write_text(json.dumps({"probes": [entry]}))
    r = subprocess.run([require_tool("mapp-opt"), model_dir / "model.mlir", "-mapp-autodiff",
                        f"-mapp-insert-probes=spec={tmp_path / 'spec.json'}",
                        "-o", tmp_path / "x.mlir"], capture_output=True, text=True)
    assert r.returncode != 0 and message in r.stderr, r.stderr

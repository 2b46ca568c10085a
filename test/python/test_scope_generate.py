"""Generation from trained weights: every generated token's logits equal the
PyTorch reference module's on the same context, greedy decoding takes their
argmax, and the store records the top-k next-token probabilities and the
attention probes of each generated token."""

import json
import sqlite3

import numpy as np
import torch

from mapp import safetensors
from mapp.reference import GPT
from conftest import require_tool
from scope_ref import TINY, compile_plan, export, reference_logits, run, train

SPEC = {"probes": [{"name": "layers.*.attn.probs", "reduce": ["attn"]},
                   {"name": "layers.*", "reduce": ["sketch"], "dim": 4}]}


def test_generated_logits_match_reference(tmp_path):
    export(tmp_path)
    plan = compile_plan(tmp_path, SPEC)
    train(tmp_path, plan, 5, "--save", tmp_path / "trained.safetensors")
    db = tmp_path / "gen.sqlite"
    out = tmp_path / "gen.jsonl"
    # 10 bytes: longer than seq_length 8, so the full forward slides its
    # window (a KV cache would need 15 positions).
    prompt = "The market"
    r = run([require_tool("mapp-run"), plan, "--generate", "--no-kv-cache",
             "--prompt", prompt, "--max-new-tokens", 6, "--greedy", "--weights",
             tmp_path / "trained.safetensors", "--tokenizer", "bytes",
             "--probe-db", db, "--generate-out", out])
    toks = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(toks) == 6

    model = GPT(TINY)
    model.load_state_dict(safetensors.load(tmp_path / "trained.safetensors")[0])
    model.eval()
    ctx = list(prompt.encode())
    for t in toks:
        window = ctx[-8:]
        assert t["context"] == window
        with torch.no_grad():
            logits = reference_logits(model, torch.tensor([window]))[0, -1]
        got = np.array(t["logits"])
        scale = logits.abs().max().item()
        assert np.abs(got - logits.numpy()).max() <= 1e-5 * scale
        assert t["token"] == int(torch.argmax(logits))
        probs = torch.softmax(logits.double(), -1)
        assert t["prob"] == pytest_approx(probs[t["token"]].item())
        top = torch.topk(probs, 20)
        assert [k["id"] for k in t["topk"]] == top.indices.tolist()
        ctx.append(t["token"])
    assert r.stdout.startswith(prompt)

    con = sqlite3.connect(db)
    rows = con.execute("SELECT position, token, prob, topk FROM generations "
                       "ORDER BY position").fetchall()
    assert [r[1] for r in rows] == [t["token"] for t in toks]
    assert len(json.loads(rows[0][3])) == 20
    # Probes fire on every generated token, tagged as generation.
    n = con.execute("SELECT count(*) FROM samples WHERE phase='generate' AND "
                    "reduction='attn'").fetchone()[0]
    assert n == 2 * 6
    mode = json.loads(con.execute("SELECT meta FROM runs").fetchone()[0])["mode"]
    assert mode == "generate"


def pytest_approx(x):
    import pytest
    return pytest.approx(x, rel=1e-4)


def test_sampling_is_seeded_and_respects_top_k(tmp_path):
    export(tmp_path)
    plan = compile_plan(tmp_path, None)
    outs = []
    for i in range(2):
        out = tmp_path / f"s{i}.jsonl"
        run([require_tool("mapp-run"), plan, "--generate", "--prompt", "ab", "--max-new-tokens", 7,
             "--temperature", "0.8", "--top-k", "3", "--seed", "5", "--weights",
             tmp_path / "init.safetensors", "--generate-out", out, "--quiet"])
        outs.append([json.loads(l) for l in out.read_text().splitlines()])
    assert [t["token"] for t in outs[0]] == [t["token"] for t in outs[1]]
    for t in outs[0]:
        assert t["token"] in [k["id"] for k in t["topk"][:3]]


def test_generation_needs_weights(tmp_path):
    import subprocess
    export(tmp_path)
    plan = compile_plan(tmp_path, None)
    r = subprocess.run([require_tool("mapp-run"), plan, "--generate"], capture_output=True, text=True)
    assert r.returncode == 1 and "--generate needs --weights" in r.stderr

"""KV-cache generation (runtime/include/mapp/rt/KvDecoder.h): on GPT (learned
positions, LayerNorm, GELU) and LLaMA (rotary, RMSNorm, SwiGLU) plans the
cached prefill + decode steps give the same greedy tokens as the full forward
per token, probabilities within 1e-5, and PyTorch's greedy continuation;
seeded sampling follows the documented sampler; attention probes in decode
record the new row of the full forward's map; bad options are clear
errors."""

import json
import math
import os
import sqlite3
import subprocess

import numpy as np
import pytest
import torch

from conftest import ROOT
from mapp import safetensors
from mapp.reference import GPT
from conftest import require_tool
from scope_ref import (compile_plan, export, reference_logits, run, splitmix64,
                       train)

G = 0x9E3779B97F4A7C15
PROMPT = "The ma"
SPEC = {"probes": [{"name": "layers.*.attn.probs", "reduce": ["attn"]},
                   {"name": "layers.*.mlp", "reduce": ["mean", "std"]}]}


def config(name):
    with open(os.path.join(ROOT, "examples", f"{name}.json")) as f:
        cfg = json.load(f)
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


@pytest.fixture(scope="module", params=["gpt-tiny", "llama-tiny"])
def trained(request, tmp_path_factory):
    """A plan with probes and weights after 10 AdamW steps (peaked enough
    that greedy choices are not near-ties)."""
    tmp = tmp_path_factory.mktemp(request.param)
    cfg = config(request.param)
    export(tmp, cfg)
    plan = compile_plan(tmp, SPEC)
    train(tmp, plan, 10, "--save", tmp / "trained.safetensors")
    return tmp, cfg, plan


def generate(tmp, plan, tag, *extra, ok=True):
    out = tmp / f"{tag}.jsonl"
    r = subprocess.run([str(c) for c in [
        require_tool("mapp-run"), plan, "--generate", "--weights",
        tmp / "trained.safetensors", "--tokenizer", "bytes",
        "--generate-out", out, "--quiet", *extra]],
        capture_output=True, text=True)
    if not ok:
        return r
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in out.read_text().splitlines()]


def test_greedy_cache_equals_full_forward_and_pytorch(trained):
    tmp, cfg, plan = trained
    T = cfg["seq_length"]
    n = T - len(PROMPT) + 1  # fills every position of the plan
    cached = generate(tmp, plan, "cached", "--prompt", PROMPT, "--greedy",
                      "--max-new-tokens", n)
    full = generate(tmp, plan, "full", "--prompt", PROMPT, "--greedy",
                    "--max-new-tokens", n, "--no-kv-cache")
    assert len(cached) == len(full) == n
    assert [t["token"] for t in cached] == [t["token"] for t in full]
    for c, f in zip(cached, full):
        assert [k["id"] for k in c["topk"]] == [k["id"] for k in f["topk"]]
        assert max(abs(a["p"] - b["p"]) for a, b in zip(c["topk"], f["topk"])) <= 1e-5
        assert c["context"] == f["context"]

    model = GPT(cfg)
    model.load_state_dict(safetensors.load(tmp / "trained.safetensors")[0])
    model.eval()
    ctx = list(PROMPT.encode())
    for t in cached:
        with torch.no_grad():
            logits = reference_logits(model, torch.tensor([ctx]))[0, -1]
        scale = logits.abs().max().item()
        assert np.abs(np.array(t["logits"]) - logits.numpy()).max() <= 1e-5 * scale
        assert t["token"] == int(torch.argmax(logits))
        ctx.append(t["token"])


def sample_like_runtime(logits, temperature, top_k, state):
    """runtime/src/probe/Generate.cpp's sampler: SplitMix64 uniform, top-k of
    the stable descending order, weights exp((l - max) / temperature)."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    m = logits[order[0]]
    k = min(top_k, len(logits)) if top_k > 0 else len(logits)
    w = [math.exp((logits[order[i]] - m) / temperature) for i in range(k)]
    state = (state + G) & ((1 << 64) - 1)
    u = (splitmix64((state - G) & ((1 << 64) - 1)) >> 11) * 2.0 ** -53 * sum(w)
    for i in range(k):
        if u < w[i]:
            return order[i], state
        u -= w[i]
    return order[k - 1], state


def test_sampling_reproducible_by_seed(trained):
    tmp, cfg, plan = trained
    args = ["--prompt", "ab", "--max-new-tokens", 12, "--temperature", "0.8",
            "--top-k", "5", "--seed", "5"]
    a = generate(tmp, plan, "s1", *args)
    b = generate(tmp, plan, "s2", *args)
    full = generate(tmp, plan, "s3", *args, "--no-kv-cache")
    assert [t["token"] for t in a] == [t["token"] for t in b] == \
        [t["token"] for t in full]
    state = 5
    for t in a:
        want, state = sample_like_runtime(
            np.array(t["logits"], dtype=np.float32).astype(float).tolist(),
            0.8, 5, state)
        assert t["token"] == want


def attn_rows(db):
    """(step, probe_id) -> [heads, rows, T] attention samples."""
    con = sqlite3.connect(db)
    out = {}
    for step, pid, shape, data in con.execute(
            "SELECT step, probe_id, shape, data FROM samples WHERE "
            "phase='generate' AND reduction='attn'"):
        shape = json.loads(shape)
        out[(step, pid)] = np.frombuffer(data, dtype=np.float32).reshape(shape)
    return out


def test_decode_probes_record_the_new_attention_row(trained):
    tmp, cfg, plan = trained
    n = 5
    generate(tmp, plan, "pc", "--prompt", PROMPT, "--greedy",
             "--max-new-tokens", n, "--probe-db", tmp / "cached.sqlite")
    generate(tmp, plan, "pf", "--prompt", PROMPT, "--greedy",
             "--max-new-tokens", n, "--probe-db", tmp / "full.sqlite",
             "--no-kv-cache")
    cached, full = attn_rows(tmp / "cached.sqlite"), attn_rows(tmp / "full.sqlite")
    assert cached.keys() == full.keys() and len(cached) == 2 * n
    T = cfg["seq_length"]
    for (step, pid), f in full.items():
        c = cached[(step, pid)]
        if step == 0:  # prefill: the whole map, as the full forward
            assert c.shape == f.shape
            np.testing.assert_allclose(c, f, atol=1e-5)
        else:  # decode: the new token's row only
            p = len(PROMPT) + step - 1
            assert c.shape == (f.shape[0], 1, T)
            np.testing.assert_allclose(c[:, 0, :], f[:, p, :], atol=1e-5)
            assert np.all(c[:, 0, p + 1:] == 0)


def test_bad_options_are_clear_errors(trained):
    tmp, cfg, plan = trained
    T = cfg["seq_length"]
    r = generate(tmp, plan, "e1", "--prompt", PROMPT, "--max-new-tokens",
                 T - len(PROMPT) + 2, ok=False)
    assert r.returncode == 1
    assert (f"need {T + 1} positions, the plan's seq_length is {T}"
            in r.stderr), r.stderr
    r = generate(tmp, plan, "e2", "--prompt", "", ok=False)
    assert r.returncode == 2 and "--prompt is empty" in r.stderr, r.stderr
    r = generate(tmp, plan, "e3", "--prompt", "a", "--max-new-tokens", 0,
                 ok=False)
    assert r.returncode == 1 and "--max-new-tokens must be >= 1" in r.stderr

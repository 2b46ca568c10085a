"""Python re-implementations of MegaScope's runtime formulas (docs/megascope.md)
and helpers shared by the test_scope_*.py files."""

import json
import math
import os
import subprocess
import sys

import numpy as np

from conftest import ROOT, require_tool

M64 = (1 << 64) - 1


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def uniform(key, n):
    return (splitmix64(key ^ splitmix64(n)) >> 11) * 2.0 ** -53


def normal(key, n):
    u1, u2 = uniform(key, 2 * n), uniform(key, 2 * n + 1)
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def step_key(seed, step, microbatch):
    return splitmix64(seed ^ splitmix64((step * 65536 + microbatch) & M64))


def sketch_matrix(seed, dim, inner):
    r = np.array([normal(seed, n) for n in range(dim * inner)])
    return r.reshape(dim, inner) / math.sqrt(dim)


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       errors="replace", **kw)
    assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stderr}"
    return r


TINY = {"variant": "gpt", "num_layers": 2, "hidden_size": 16,
        "num_attention_heads": 2, "seq_length": 8, "vocab_size": 256,
        "micro_batch_size": 2, "tie_embeddings": True}
CORPUS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")
OPT = "lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"


def export(tmp, cfg=TINY, seed=7):
    """Reference GPT -> model.mlir + init.safetensors (as test_train_e2e)."""
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", seed], env=env)


def compile_plan(tmp, spec=None, name="model"):
    """model.mlir -> autodiff, AdamW, probes from `spec` (a dict) -> plan."""
    passes = ["-mapp-autodiff", f"-mapp-optimizer={OPT}"]
    if spec is not None:
        (tmp / f"{name}.json").write_text(json.dumps(spec))
        passes.append(f"-mapp-insert-probes=spec={tmp / (name + '.json')}")
    run([require_tool("mapp-opt"), tmp / "model.mlir", *passes, "-o", tmp / f"{name}.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir",
         "-o", tmp / f"{name}.mplan"])
    return tmp / f"{name}.mplan"


def train(tmp, plan, steps, *extra, tag="run"):
    """mapp-run on the corpus; returns (metrics, batches)."""
    run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", steps, "--seed", 11, "--weights", tmp / "init.safetensors",
         "--metrics", tmp / f"{tag}.metrics.jsonl",
         "--dump-batches", tmp / f"{tag}.batches.jsonl", "--quiet", *extra])
    read = lambda p: [json.loads(l) for l in p.read_text().splitlines()]
    return read(tmp / f"{tag}.metrics.jsonl"), read(tmp / f"{tag}.batches.jsonl")


def reference_logits(model, tokens):
    """mapp.reference.GPT's forward up to the logits."""
    import torch
    b, t = tokens.shape
    x = model.wte(tokens)
    if model.wpe is not None:
        x = x + model.wpe.weight[:t]
    for layer in model.layers:
        x = layer(x)
    return model.lm_head(model.ln_f(x))

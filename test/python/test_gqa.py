"""Grouped-query and multi-query attention end to end on CPU.

The reference module (mapp.reference.GPT with num_query_groups < heads:
separate q/k/v projections, each key/value head shared by heads/groups query
heads) is exported, differentiated, given AdamW and trained 30 steps by
mapp-run; PyTorch trains the same module on the batches mapp-run dumped.
Every loss must agree within 1e-5 relative, every step-0 gradient too.
Tensor parallelism splits the key/value heads like Megatron's query groups:
tp=2 with 2 key/value heads equals the single-rank run step for step, and so
does tp=4 with 2 key/value heads (each replicated on 2 ranks); tp=8 compiles;
a tp that neither divides nor is a multiple of the key/value heads is a
located error.
KV-cache generation keeps only the key/value heads in its caches and gives
the full re-forward's and PyTorch's greedy tokens.
"""

import json
import os
import pathlib
import re
import subprocess

import pytest
import sys
import torch

from conftest import ROOT, require_tool
from mapp import safetensors
from mapp.reference import GPT

STEPS = 30
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"
TOLERANCE = 1e-5
OPT = f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} weight-decay={WD}"

CONFIGS = {
    "llama-gqa": {"variant": "llama", "num_layers": 2, "hidden_size": 32,
                  "num_attention_heads": 4, "num_query_groups": 2,
                  "ffn_hidden_size": 64, "seq_length": 16, "vocab_size": 256,
                  "micro_batch_size": 2, "tie_embeddings": False},
    "gpt-mqa": {"variant": "gpt", "num_layers": 2, "hidden_size": 32,
                "num_attention_heads": 4, "num_query_groups": 1,
                "seq_length": 16, "vocab_size": 256, "micro_batch_size": 2},
}


def run(cmd, ok=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=300, **kw)
    if ok:
        assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r


def export(tmp, cfg):
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", 7], env=env)
    return tmp / "model.mlir"


def plan(tmp, model, passes, name):
    run([require_tool("mapp-opt"), model, *passes, "-o", tmp / f"{name}.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir",
         "-o", tmp / f"{name}.mplan"])
    return tmp / f"{name}.mplan"


def train(tmp, mplan, name, *extra):
    out = tmp / name
    out.mkdir()
    run([require_tool("mapp-run"), mplan, "--backend=cpu", "--data", CORPUS,
         "--tokenizer", "bytes", "--steps", STEPS, "--seed", 11,
         "--weights", tmp / "init.safetensors", "--metrics", out / "m.jsonl",
         "--dump-batches", out / "b.jsonl", "--quiet", "--threads", 1, *extra])
    return ([json.loads(l) for l in (out / "m.jsonl").read_text().splitlines()],
            [json.loads(l) for l in (out / "b.jsonl").read_text().splitlines()])


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_training_matches_pytorch_gqa(tmp_path, name):
    cfg = CONFIGS[name]
    ir = export(tmp_path, cfg).read_text()
    assert "attn.k.weight" in ir and "num_query_groups" in ir
    mplan = plan(tmp_path, tmp_path / "model.mlir",
                 ["-mapp-autodiff", f"-mapp-optimizer={OPT}"], "single")
    metrics, batches = train(tmp_path, mplan, "single", "--save-grads",
                             tmp_path / "grads.safetensors")
    assert len(metrics) == STEPS
    grads = safetensors.load(tmp_path / "grads.safetensors")[0]

    model = GPT(cfg)
    model.load_state_dict(safetensors.load(tmp_path / "init.safetensors")[0])
    # The module is grouped-query attention: k/v have fewer heads than q.
    kv = cfg["num_query_groups"] * cfg["hidden_size"] // cfg["num_attention_heads"]
    assert model.layers[0].attn.k.weight.shape == (kv, cfg["hidden_size"])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    worst = 0.0
    for step, batch in enumerate(batches):
        opt.zero_grad()
        loss = model(torch.tensor(batch["tokens"]), torch.tensor(batch["targets"]))
        loss.backward()
        if step == 0:
            # The key bias's exact gradient is 0 (a constant shift of every
            # score of a row): relative to the largest gradient, not its own.
            top = max(p.grad.abs().max().item() for p in model.parameters())
            for pname, p in model.named_parameters():
                scale = max(p.grad.abs().max().item(), 1e-3 * top)
                err = (grads[pname] - p.grad).abs().max().item() / scale
                assert err <= TOLERANCE, f"step-0 gradient of {pname}: {err:.2e}"
        opt.step()
        e = rel(metrics[step]["loss"], loss.item())
        worst = max(worst, e)
        assert e <= TOLERANCE, f"step {step}: {metrics[step]['loss']} vs {loss.item()} ({e:.2e})"
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    print(f"{name}: worst relative loss difference over {STEPS} steps {worst:.2e}")


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_kv_heads(tmp_path, tp):
    """tp=2 splits the 2 key/value heads (one per rank); tp=4 replicates
    them (ranks 0,1 hold head 0, ranks 2,3 head 1). Both equal the
    single-rank run step for step, losses and gradient norms."""
    cfg = CONFIGS["llama-gqa"]
    model = export(tmp_path, cfg)
    ref = train(tmp_path, plan(tmp_path, model, pipe(1), "tp1"), "tp1")
    got = train(tmp_path, plan(tmp_path, model, pipe(tp), f"tp{tp}"), f"tp{tp}",
                "--comm=local")
    ir = (tmp_path / f"tp{tp}.mlir").read_text()
    # Each rank: 4/tp query heads and 1 key/value head of 8 columns.
    q = 8 * 4 // tp
    assert f"tensor<2x16x{q}xf32>, tensor<2x16x8xf32>, tensor<2x16x8xf32>) -> tensor<2x16x{q}xf32>" in ir
    if tp == 4:
        # Replicated: the k/v weights stay whole (no shard_dim) and each rank
        # cuts its head's rows from the heads repeated tp/kv_heads times.
        line = next(l for l in ir.splitlines() if "mapp.param @layers.0.attn.k.weight" in l)
        assert "tensor<16x32xf32>" in line and "shard_dim" not in line, line
        assert "mapp.scatter_to_group" in ir
    assert len(got[0]) == STEPS
    worst = 0.0
    for step, (a, b) in enumerate(zip(got[0], ref[0])):
        worst = max(worst, rel(a["loss"], b["loss"]))
        assert rel(a["loss"], b["loss"]) <= TOLERANCE, (step, a["loss"], b["loss"])
        assert rel(a["grad_norm"], b["grad_norm"]) <= TOLERANCE, step
    print(f"tp={tp}: worst relative loss difference over {STEPS} steps {worst:.2e}")


def pipe(tp, extra=""):
    return [f"--mapp-train-pipeline=tp={tp} microbatches=1 optimizer=adamw {OPT}{extra}"]


def test_replicated_kv_heads_compile_at_tp8(tmp_path):
    """8 query heads over 2 key/value heads at tp=8 (each head on 4 ranks),
    with pp=2 too: compiles to a plan, one query head per rank."""
    cfg = dict(CONFIGS["llama-gqa"], num_attention_heads=8, num_query_groups=2,
               hidden_size=64)
    model = export(tmp_path, cfg)
    plan(tmp_path, model, pipe(8), "tp8")
    ir = (tmp_path / "tp8.mlir").read_text()
    assert "tensor<2x16x8xf32>, tensor<2x16x8xf32>, tensor<2x16x8xf32>) -> tensor<2x16x8xf32>" in ir
    plan(tmp_path, model, pipe(8, " pp=2"), "tp8pp2")


def test_kv_heads_tp_mismatch_is_located(tmp_path):
    """tp=6 over 12 query heads and 4 key/value heads: tp neither divides
    the key/value heads nor is a multiple of them; the error names both and
    points at the attention op."""
    cfg = dict(CONFIGS["llama-gqa"], num_attention_heads=12, num_query_groups=4,
               hidden_size=48, ffn_hidden_size=96, vocab_size=96)
    model = export(tmp_path, cfg)
    r = run([require_tool("mapp-opt"), model, *pipe(6)], ok=False)
    assert r.returncode != 0
    assert "tp=6 and the 4 key/value heads (num_query_groups): tp must divide them" in r.stderr
    assert re.search(r"model\.mlir:\d+:\d+: error", r.stderr), r.stderr


def test_kv_cache_generation_gqa(tmp_path):
    """Greedy generation with the KV cache (only key/value heads cached)
    equals the full re-forward per token and PyTorch's greedy continuation."""
    import numpy as np
    from scope_ref import reference_logits
    cfg = CONFIGS["llama-gqa"]
    export(tmp_path, cfg)
    mplan = plan(tmp_path, tmp_path / "model.mlir",
                 ["-mapp-autodiff", f"-mapp-optimizer={OPT}"], "gen")
    train(tmp_path, mplan, "trained", "--save", tmp_path / "trained.safetensors")
    prompt = "The ma"
    n = cfg["seq_length"] - len(prompt) + 1

    def generate(tag, *extra):
        out = tmp_path / f"{tag}.jsonl"
        run([require_tool("mapp-run"), mplan, "--generate", "--weights",
             tmp_path / "trained.safetensors", "--tokenizer", "bytes",
             "--generate-out", out, "--quiet", "--prompt", prompt, "--greedy",
             "--max-new-tokens", n, *extra])
        return [json.loads(l) for l in out.read_text().splitlines()]

    cached, full = generate("cached"), generate("full", "--no-kv-cache")
    assert len(cached) == len(full) == n
    assert [t["token"] for t in cached] == [t["token"] for t in full]
    model = GPT(cfg)
    model.load_state_dict(safetensors.load(tmp_path / "trained.safetensors")[0])
    model.eval()
    ctx = list(prompt.encode())
    for t in cached:
        with torch.no_grad():
            logits = reference_logits(model, torch.tensor([ctx]))[0, -1]
        scale = logits.abs().max().item()
        assert np.abs(np.array(t["logits"]) - logits.numpy()).max() <= 1e-5 * scale
        assert t["token"] == int(torch.argmax(logits))
        ctx.append(t["token"])

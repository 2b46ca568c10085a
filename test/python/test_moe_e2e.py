"""End to end: an MoE GPT (docs/moe.md) exported from the reference module
trains on mapp-run's CPU backend and matches PyTorch (Debian's torch 1.13,
fp32) on the same batches: every step's loss (cross entropy plus every
layer's load-balancing and z-loss) and every step-0 gradient within 1e-5
relative — dropless, and with capacity drops.

The reference's MoE ops (python/mapp/moe.py) are checked against the
independent formulas of test/python/moe_ref.py first, so the comparison is
against Megatron's math and not against the exporter's own ops."""
import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_ref  # noqa: E402
from conftest import ROOT, require_tool  # noqa: E402
from mapp import moe, safetensors  # noqa: E402
from mapp.reference import GPT  # noqa: E402
from train_harness import (CORPUS, LR, BETAS, EPS, WD, compile_and_train, run,  # noqa: E402
                           train_torch_and_compare)

STEPS = 30
TOLERANCE = 1e-5

BASE = {"variant": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "seq_length": 16, "vocab_size": 256, "micro_batch_size": 2,
        "num_moe_experts": 4, "moe_router_topk": 2, "moe_layer_freq": 1,
        "moe_aux_loss_coeff": 1e-2, "moe_z_loss_coeff": 1e-3, "moe_ffn_hidden_size": 96}
CONFIGS = {
    "dropless": BASE,
    "capacity": dict(BASE, moe_capacity_factor=1.0),
    "llama-every-2nd": dict(BASE, variant="llama", num_layers=3, moe_layer_freq=2,
                            tie_embeddings=False),
}


def _without_aux(model):
    """The same model with the auxiliary losses switched off."""
    for layer in model.layers:
        if isinstance(layer.mlp, moe.MoE):
            layer.mlp.aux_coeff = layer.mlp.z_coeff = 0.0


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_moe_loss_curve_and_gradients_match_pytorch(tmp_path, name, monkeypatch):
    cfg = CONFIGS[name]
    metrics, batches, mapp_grads = compile_and_train(tmp_path, cfg, STEPS)
    weights = safetensors.load(tmp_path / "init.safetensors")[0]
    model = GPT(cfg)
    calls = []  # (slots, counts) of every assign PyTorch ran, in order
    assign = moe.assign
    monkeypatch.setattr(moe, "assign", lambda *a: (lambda r: calls.append(r) or r)(assign(*a)))
    worst = train_torch_and_compare(model, weights, metrics, batches, mapp_grads, TOLERANCE)
    # The capacity run must really drop choices (else it tests nothing new).
    dropped = sum(int((slots < 0).sum()) for slots, _ in calls)
    assert (dropped > 0) == ("moe_capacity_factor" in cfg), dropped
    # metrics.jsonl: rows per expert of every MoE layer, step by step, as
    # PyTorch routed them (one forward per step, layers in order).
    layers = sum(moe.moe_layers(model.config))
    assert len(calls) == STEPS * layers
    for step, m in enumerate(metrics):
        got = m["expert_tokens"]
        assert len(got) == layers
        want = [c.tolist() for _, c in calls[step * layers:(step + 1) * layers]]
        assert [got[k] for k in sorted(got)] == want, f"step {step}"
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.3
    # The auxiliary terms are in mapp's loss: without them PyTorch's step-0
    # loss differs by far more than the tolerance.
    plain = GPT(cfg)
    plain.load_state_dict(weights)
    _without_aux(plain)
    b = batches[0]
    ce = plain(torch.tensor(b["tokens"]), torch.tensor(b["targets"])).item()
    assert abs(metrics[0]["loss"] - ce) > 100 * TOLERANCE * abs(ce)
    print(f"{name}: worst relative loss difference over {STEPS} steps {worst:.2e}")


def test_importer_graph_trains_like_pytorch(tmp_path):
    """The config-key path: mapp-translate --import-gpt-config builds the MoE
    GPT from the config alone; with the reference's initial weights it trains
    like PyTorch (capacity drops, Megatron argument spellings)."""
    cfg = dict(CONFIGS["capacity"])
    megatron = {f"--{k.replace('_', '-')}": v for k, v in cfg.items() if k != "variant"}
    megatron.update({"--normalization": "LayerNorm", "--openai-gelu": True,
                     "--expert-model-parallel-size": 2})
    (tmp_path / "megatron.json").write_text(json.dumps(megatron))
    model = GPT(cfg, seed=3)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    safetensors.save(weights, tmp_path / "init.safetensors", {"format": "pt"})
    run([require_tool("mapp-translate"), "--import-gpt-config", tmp_path / "megatron.json",
         "-o", tmp_path / "model.mlir"])
    opt = f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} weight-decay={WD}"
    run([require_tool("mapp-opt"), tmp_path / "model.mlir", "-mapp-autodiff",
         f"-mapp-optimizer={opt}", "-o", tmp_path / "train.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp_path / "train.mlir",
         "-o", tmp_path / "model.mplan"])
    steps = 10
    run([require_tool("mapp-run"), tmp_path / "model.mplan", "--backend=cpu", "--data", CORPUS,
         "--tokenizer", "bytes", "--steps", steps, "--seed", 5,
         "--weights", tmp_path / "init.safetensors", "--metrics", tmp_path / "m.jsonl",
         "--dump-batches", tmp_path / "b.jsonl", "--save-grads", tmp_path / "g.safetensors",
         "--quiet"])
    metrics = [json.loads(l) for l in (tmp_path / "m.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp_path / "b.jsonl").read_text().splitlines()]
    grads = safetensors.load(tmp_path / "g.safetensors")[0]
    assert len(metrics) == steps
    train_torch_and_compare(GPT(cfg), weights, metrics, batches, grads, TOLERANCE)


@pytest.mark.parametrize("cap_factor", [None, 0.5])
def test_reference_block_matches_moe_ref(cap_factor):
    """The MoE block of the reference (torch.library ops + autograd through
    them) against test/python/moe_ref.py's formulas, forward and backward."""
    cfg = dict(BASE, moe_capacity_factor=cap_factor) if cap_factor else BASE
    torch.manual_seed(5)
    block = moe.MoE(GPT(cfg).config)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(2, 16, 64, requires_grad=True)
    weighting = torch.randn(2, 16, 64)
    y, losses = block(x)
    total = (y * weighting).sum() + sum(losses)
    got = torch.autograd.grad(total, [x, *block.parameters()], retain_graph=False)

    x2 = x.detach().clone().requires_grad_()
    w_router = block.router.weight.detach().clone().requires_grad_()
    fc1 = block.experts.fc1.weight.detach().clone().requires_grad_()
    fc2 = block.experts.fc2.weight.detach().clone().requires_grad_()
    flat = x2.reshape(32, 64)
    logits = flat @ w_router.t()
    probs, experts = moe_ref.router(logits, 2)
    cap = None if cap_factor is None else moe_ref.capacity(32, 2, 4, cap_factor)
    keep = moe_ref.kept_mask(probs, experts, 4, cap)
    act = lambda h: torch.nn.functional.gelu(h, approximate="tanh")
    y2 = moe_ref.experts_ffn(flat, probs, experts, keep, fc1, fc2, act).reshape(2, 16, 64)
    torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-6)
    aux = moe_ref.aux_loss(logits, experts, 1e-2) + moe_ref.z_loss(logits, 1e-3)
    torch.testing.assert_close(sum(losses), aux, rtol=1e-5, atol=1e-7)
    total2 = (y2 * weighting).sum() + aux
    want = torch.autograd.grad(total2, [x2, w_router, fc1, fc2])
    assert not math.isclose(float(got[1].abs().sum()), 0.0)
    for g, w, what in zip(got, want, ["x", "router", "fc1", "fc2"]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=what)


@pytest.mark.parametrize("recompute", ["", " recompute=full"])
def test_expert_tokens_sum_microbatches(tmp_path, monkeypatch, recompute):
    """expert_tokens of a step with 2 microbatches is the sum of PyTorch's
    routing of both; a recomputed forward is not counted twice."""
    cfg = dict(BASE, seq_length=8)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT", "--config",
         tmp_path / "cfg.json", "-o", tmp_path / "m.mlir", "--weights", tmp_path / "w.safetensors"],
        env=env)
    run([require_tool("mapp-opt"), tmp_path / "m.mlir",
         f"--mapp-train-pipeline=tp=1 pp=1 dp=1 microbatches=2 optimizer=adamw{recompute}",
         "-o", tmp_path / "t.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp_path / "t.mlir", "-o", tmp_path / "t.mplan"])
    run([require_tool("mapp-run"), tmp_path / "t.mplan", "--backend=cpu", "--data", CORPUS,
         "--tokenizer", "bytes", "--steps", 1, "--weights", tmp_path / "w.safetensors",
         "--metrics", tmp_path / "m.jsonl", "--dump-batches", tmp_path / "b.jsonl", "--quiet"])
    got = json.loads((tmp_path / "m.jsonl").read_text())["expert_tokens"]
    batches = [json.loads(l) for l in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [b["microbatch"] for b in batches] == [0, 1]
    model = GPT(cfg)
    model.load_state_dict(safetensors.load(tmp_path / "w.safetensors")[0])
    calls = []
    assign = moe.assign
    monkeypatch.setattr(moe, "assign", lambda *a: (lambda r: calls.append(r[1]) or r)(assign(*a)))
    with torch.no_grad():
        for b in batches:
            model(torch.tensor(b["tokens"]), torch.tensor(b["targets"]))
    want = [(calls[layer] + calls[2 + layer]).tolist() for layer in range(2)]
    assert sorted(got) == ["layers.0.mlp.moe_assign", "layers.1.mlp.moe_assign"]
    assert [got[k] for k in sorted(got)] == want
    assert all(sum(c) == 2 * 2 * 8 * 2 for c in want)  # 2 microbatches of B·T·k rows


def test_exporter_names_a_misused_moe_op():
    """The exporter's MoE lowering checks what it is given: 3-d router
    logits are an error naming the op and the user's line."""
    from mapp.export import export_module
    from mapp.values import ExportError

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 8)
            self.router = torch.nn.Linear(8, 4, bias=False)

        def forward(self, tokens, targets):
            x = self.emb(tokens)
            probs, _ = moe._call("moe_router", self.router(x), 2)  # [B, T, E]: not flattened
            return probs.sum()

    tokens = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ExportError, match=r"test_moe_e2e.py:\d+.*moe_router.*router logits must "
                                          r"be 2-d \[tokens, features\], got \[2, 4, 4\]"):
        export_module(Bad(), tokens, tokens.clone())

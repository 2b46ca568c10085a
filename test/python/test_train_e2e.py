"""End-to-end: the compiled training step on mapp-run's CPU backend against
PyTorch (Debian's torch 1.13, fp32) — same initial weights, same batches.

The exporter writes the reference GPT (and its LLaMA-style variant) and its
initial weights; mapp-opt differentiates it and adds AdamW; mapp-translate
writes the plan; mapp-run trains 50 steps and dumps the exact batches it
used. PyTorch trains mapp.reference.GPT on those batches with
torch.optim.AdamW. Every step's loss and every step-0 gradient must agree
within 1e-5 relative.
"""

import json
import os
import pathlib
import subprocess

import pytest
import torch

from conftest import ROOT, find_tool
from mapp import safetensors
from mapp.reference import GPT

STEPS = 50
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"
TOLERANCE = 1e-5

CONFIGS = {
    "gpt-tied": {"variant": "gpt", "num_layers": 2, "hidden_size": 32,
                 "num_attention_heads": 4, "seq_length": 16, "vocab_size": 256,
                 "micro_batch_size": 2, "tie_embeddings": True},
    "llama": {"variant": "llama", "num_layers": 2, "hidden_size": 32,
              "num_attention_heads": 4, "ffn_hidden_size": 64, "seq_length": 16,
              "vocab_size": 256, "micro_batch_size": 2, "tie_embeddings": False},
}


def tool(name):
    path = find_tool(name)
    if not path:
        pytest.skip(f"{name} is not built")
    return path


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stderr}"
    return r


def compile_and_train(tmp, cfg):
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run(["/usr/bin/python3", "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", 7], env=env)
    opt = (f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} "
           f"weight-decay={WD}")
    run([tool("mapp-opt"), tmp / "model.mlir", "-mapp-autodiff",
         f"-mapp-optimizer={opt}", "-o", tmp / "train.mlir"])
    run([tool("mapp-translate"), "--mapp-to-plan", tmp / "train.mlir",
         "-o", tmp / "model.mplan"])
    run([tool("mapp-run"), tmp / "model.mplan", "--backend=cpu",
         "--data", CORPUS, "--tokenizer", "bytes", "--steps", STEPS,
         "--seed", 11, "--weights", tmp / "init.safetensors",
         "--metrics", tmp / "metrics.jsonl", "--dump-batches", tmp / "batches.jsonl",
         "--save-grads", tmp / "grads.safetensors", "--quiet"])
    metrics = [json.loads(l) for l in (tmp / "metrics.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp / "batches.jsonl").read_text().splitlines()]
    return metrics, batches, safetensors.load(tmp / "grads.safetensors")[0]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_loss_curve_and_gradients_match_pytorch(tmp_path, name):
    cfg = CONFIGS[name]
    metrics, batches, mapp_grads = compile_and_train(tmp_path, cfg)
    assert len(metrics) == STEPS and len(batches) == STEPS

    torch.manual_seed(0)
    model = GPT(cfg)
    model.load_state_dict(safetensors.load(tmp_path / "init.safetensors")[0])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    worst = 0.0
    for step, batch in enumerate(batches):
        assert batch["step"] == step
        tokens = torch.tensor(batch["tokens"], dtype=torch.long)
        targets = torch.tensor(batch["targets"], dtype=torch.long)
        opt.zero_grad()
        loss = model(tokens, targets)
        loss.backward()
        if step == 0:
            for pname, p in model.named_parameters():
                g = mapp_grads[pname]
                scale = p.grad.abs().max().item()
                err = (g - p.grad).abs().max().item() / max(scale, 1e-12)
                assert err <= TOLERANCE, f"step-0 gradient of {pname}: {err:.2e}"
        opt.step()
        err = relative(metrics[step]["loss"], loss.item())
        worst = max(worst, err)
        assert err <= TOLERANCE, (
            f"step {step}: mapp {metrics[step]['loss']:.8f} vs torch "
            f"{loss.item():.8f} ({err:.2e} relative)")
    # The run must actually learn: the loss falls.
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    print(f"{name}: worst relative loss difference over {STEPS} steps {worst:.2e}")

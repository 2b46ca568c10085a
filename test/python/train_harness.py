"""Shared harness of the training tests against PyTorch: export a module
(mapp.export CLI), differentiate and add AdamW (mapp-opt), write the plan
(mapp-translate), train on mapp-run's CPU backend and dump the batches it
used; then train the same PyTorch module on those batches with
torch.optim.AdamW and compare every step's loss and every step-0 gradient
(relative to the largest gradient of the tensor)."""

import json
import os
import pathlib
import subprocess
import sys

import torch

from conftest import ROOT, require_tool
from mapp import safetensors

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stderr}"
    return r


def export(tmp, cfg, module="mapp.reference:GPT", export_args=(), pythonpath=()):
    """`module` built from `cfg` and exported into tmp/model.mlir, its
    weights (seed 7) into tmp/init.safetensors."""
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), *pythonpath]))
    run([sys.executable, "-m", "mapp.export", "--module", module,
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", 7, *export_args], env=env)


def plan_losses(tmp, name, steps):
    """tmp/<name>.mlir (a training graph) lowered to a plan and run `steps`
    CPU steps from tmp/init.safetensors over rank threads: the losses."""
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir",
         "-o", tmp / f"{name}.mplan"])
    run([require_tool("mapp-run"), tmp / f"{name}.mplan", "--backend=cpu", "--data", CORPUS,
         "--tokenizer", "bytes", "--steps", steps, "--seed", 11,
         "--weights", tmp / "init.safetensors", "--metrics", tmp / f"{name}.jsonl",
         "--comm=local", "--threads", 1, "--quiet"])
    return [json.loads(l)["loss"] for l in (tmp / f"{name}.jsonl").read_text().splitlines()]


def compile_and_train(tmp, cfg, steps, module="mapp.reference:GPT", export_args=(),
                      pythonpath=(), opt_args=(), pre_args=()):
    """-> (metrics, batches, step-0 grads) of `steps` mapp-run CPU steps;
    opt_args: passes run after the optimizer (e.g. -mapp-fuse); pre_args:
    before autodiff (e.g. -mapp-decompose-norms)."""
    export(tmp, cfg, module, export_args, pythonpath)
    opt = (f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} "
           f"weight-decay={WD}")
    run([require_tool("mapp-opt"), tmp / "model.mlir", *pre_args, "-mapp-autodiff",
         f"-mapp-optimizer={opt}", *opt_args, "-o", tmp / "train.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / "train.mlir",
         "-o", tmp / "model.mplan"])
    run([require_tool("mapp-run"), tmp / "model.mplan", "--backend=cpu",
         "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
         "--seed", 11, "--weights", tmp / "init.safetensors",
         "--metrics", tmp / "metrics.jsonl", "--dump-batches", tmp / "batches.jsonl",
         "--save-grads", tmp / "grads.safetensors", "--quiet"])
    metrics = [json.loads(l) for l in (tmp / "metrics.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp / "batches.jsonl").read_text().splitlines()]
    assert len(metrics) == steps and len(batches) == steps
    return metrics, batches, safetensors.load(tmp / "grads.safetensors")[0]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def train_torch_and_compare(model, weights, metrics, batches, mapp_grads, tolerance,
                            loss_of=lambda out: out):
    """Loads `weights` into `model`, trains it on `batches` with AdamW and
    asserts every loss and every step-0 gradient within `tolerance`
    relative; returns the worst relative loss difference."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    buffers = {name for name, _ in model.named_buffers()}
    assert not unexpected and set(missing) <= buffers, (missing, unexpected)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD)
    worst = 0.0
    for step, batch in enumerate(batches):
        assert batch["step"] == step
        tokens = torch.tensor(batch["tokens"], dtype=torch.long)
        targets = torch.tensor(batch["targets"], dtype=torch.long)
        opt.zero_grad()
        loss = loss_of(model(tokens, targets))
        loss.backward()
        if step == 0:
            for pname, p in model.named_parameters():
                g = mapp_grads[pname]
                scale = p.grad.abs().max().item()
                err = (g - p.grad).abs().max().item() / max(scale, 1e-12)
                assert err <= tolerance, f"step-0 gradient of {pname}: {err:.2e}"
        opt.step()
        err = relative(metrics[step]["loss"], loss.item())
        worst = max(worst, err)
        assert err <= tolerance, (
            f"step {step}: mapp {metrics[step]['loss']:.8f} vs torch "
            f"{loss.item():.8f} ({err:.2e} relative)")
    return worst

"""End to end: export the reference model, compile it with mapp-opt
(autodiff, optimizer, memory plan, lowering), run one step with mapp-run on
CPU, and compare loss, gradient norm and every gradient with PyTorch on the
batch mapp-run used."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, find_tool
from mapp import safetensors
from mapp.config import load_config
from mapp.reference import GPT

DATA = os.path.join(ROOT, "..", "shared", "data", "gpt", "news-1k.jsonl")


@pytest.mark.parametrize("example", ["gpt-tiny", "llama-tiny"])
def test_one_step_matches_pytorch(tmp_path, example):
    tools = [find_tool(t) for t in ("mapp-opt", "mapp-translate", "mapp-run")]
    if None in tools or not os.path.exists(DATA):
        pytest.skip("needs mapp-opt, mapp-translate, mapp-run and shared/data")
    opt, translate, run = tools
    cfg_path = os.path.join(ROOT, "examples", f"{example}.json")
    t = lambda n: str(tmp_path / n)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    subprocess.run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
                    "--config", cfg_path, "-o", t("m.mlir"), "--weights", t("w.safetensors")],
                   env=env, check=True)
    subprocess.run([opt, t("m.mlir"), "--mapp-autodiff", "--mapp-optimizer", "--mapp-plan-memory",
                    "--mapp-lower-to-plan", "-o", t("plan.mlir")], check=True, capture_output=True)
    subprocess.run([translate, "--mapp-to-plan", t("plan.mlir"), "-o", t("m.mplan")], check=True)
    subprocess.run([run, t("m.mplan"), "--data", DATA, "--tokenizer", "bytes", "--steps", "1",
                    "--weights", t("w.safetensors"), "--metrics", t("metrics.jsonl"),
                    "--dump-batches", t("batches.jsonl"), "--save-grads", t("g.safetensors"),
                    "--quiet", "--threads", "2"], check=True)
    metrics = json.loads(open(t("metrics.jsonl")).readline())
    batch = json.loads(open(t("batches.jsonl")).readline())

    model = GPT(load_config(cfg_path))
    weights, _ = safetensors.load(t("w.safetensors"))
    model.load_state_dict(weights)
    loss = model(torch.tensor(batch["tokens"], dtype=torch.int32),
                 torch.tensor(batch["targets"], dtype=torch.int32))
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
    assert abs(metrics["loss"] - loss.item()) < 1e-5 * abs(loss.item())
    assert abs(metrics["grad_norm"] - norm.item()) < 1e-5 * norm.item()
    grads, _ = safetensors.load(t("g.safetensors"))
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)

"""bench/gpu/e2e_check.py's PyTorch side trains with the recipe of the curve
plans (clipping, warmup-cosine), read from the config's "_curve_train"
(bench/gpu/prepare_fusion.sh writes both from one value): checked on the CPU
against mapp-run's plan with the same optimizer options, and against a run
without the recipe, which must part (so the check can fail)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, require_tool

torch = pytest.importorskip("torch")

BENCH = os.path.join(ROOT, "bench", "gpu")
CORPUS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")
CFG = {"variant": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "seq_length": 32, "vocab_size": 256, "micro_batch_size": 2, "tie_embeddings": True}
RECIPE = {"clip": 0.5, "warmup": 3, "total_steps": 12, "min_lr": 1e-4}
OPTIONS = ("lr=3e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1 max-grad-norm=0.5 "
           "lr-schedule=cosine warmup=3 total-steps=12 min-lr=1e-4")


def e2e_check(args):
    """e2e_check.main() on the CPU; its printed line."""
    code = ("import sys; sys.path[:0] = [%r, %r]; import e2e_check; "
            "e2e_check.DEVICE = 'cpu'; sys.argv = ['e2e_check.py'] + sys.argv[1:]; "
            "e2e_check.main()" % (BENCH, os.path.join(ROOT, "python")))
    r = subprocess.run([sys.executable, "-c", code] + args, capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr


@pytest.fixture(scope="module")
def curve(tmp_path_factory):
    translate, opt = require_tool("mapp-translate"), require_tool("mapp-opt")
    run = require_tool("mapp-run")
    d = tmp_path_factory.mktemp("recipe")
    cfg = d / "cfg.json"
    cfg.write_text(json.dumps(dict(CFG, _curve_train=RECIPE)))
    subprocess.run([translate, "--import-gpt-config", str(cfg), "-o", str(d / "m.mlir")], check=True)
    subprocess.run([opt, str(d / "m.mlir"), "-mapp-autodiff", f"-mapp-optimizer={OPTIONS}",
                    "-mapp-fuse", "-o", str(d / "p.mlir")], check=True)
    subprocess.run([translate, "--mapp-to-plan", str(d / "p.mlir"), "-o", str(d / "p.mplan")],
                   check=True)
    subprocess.run([sys.executable, os.path.join(BENCH, "e2e_check.py"), "init", str(cfg),
                    str(d / "init.safetensors")], check=True,
                   env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    subprocess.run([run, str(d / "p.mplan"), "--data", CORPUS, "--tokenizer", "bytes",
                    "--steps", "12", "--seed", "11", "--weights", str(d / "init.safetensors"),
                    "--metrics", str(d / "m.jsonl"), "--dump-batches", str(d / "b.jsonl"),
                    "--quiet"], check=True)
    return d


def test_recipe_from_the_config_matches_the_plan(curve):
    d = curve
    line = e2e_check([str(d / "cfg.json"), str(d / "init.safetensors"), str(d / "m.jsonl"),
                      str(d / "b.jsonl"), "--lr", "3e-3", "--losses-out", str(d / "t.json")])
    assert line.endswith("PASS"), line
    torch_fp32 = json.load(open(d / "t.json"))["torch_fp32"]
    mapp = [json.loads(l)["loss"] for l in open(d / "m.jsonl")]
    worst = max(abs(a - b) / b for a, b in zip(mapp, torch_fp32))
    assert worst < 1e-5, (worst, mapp, torch_fp32)
    lrs = [json.loads(l)["lr"] for l in open(d / "m.jsonl")]
    assert lrs[0] == pytest.approx(1e-3) and lrs[2] == pytest.approx(3e-3)  # the warmup ran


def test_without_the_recipe_the_curves_part(curve):
    d = curve
    (d / "plain.json").write_text(json.dumps(CFG))
    line = e2e_check([str(d / "plain.json"), str(d / "init.safetensors"), str(d / "m.jsonl"),
                      str(d / "b.jsonl"), "--lr", "3e-3", "--no-fp32"])
    assert line.endswith("FAIL"), line

"""--mapp-mixed-precision end to end: the pass's IR (loss_scale attrs on the
loss-gradient seed and the updates) lowered to a plan and run on the CPU.

References: the same model compiled without the pass (a static power-of-two
scale must give identical losses and parameters bit for bit), and the
dynamic rule itself (a step is skipped iff its scaled gradient norm exceeds
fp16's 65504; the scale halves after each skip), checked row by row.
"""
import json
import os
import pathlib
import subprocess

import pytest
import sys

from conftest import ROOT, read_st, require_tool

CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"
CFG = {"variant": "gpt", "num_layers": 1, "hidden_size": 16,
       "num_attention_heads": 2, "seq_length": 8, "vocab_size": 256,
       "micro_batch_size": 2, "tie_embeddings": True}


def run(cmd, check=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    if check:
        assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mp")
    (tmp / "cfg.json").write_text(json.dumps(CFG))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", 7])
    return tmp


def compile_plan(model, name, mp=None):
    args = [require_tool("mapp-opt"), model / "model.mlir", "-mapp-autodiff",
            "-mapp-optimizer=lr=1e-3"]
    if mp:
        args.append(f"-mapp-mixed-precision={mp}")
    run([*args, "-o", model / f"{name}.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", model / f"{name}.mlir",
         "-o", model / f"{name}.mplan"])
    return model / f"{name}.mplan"


def train(model, plan, steps, tag):
    m, w = model / f"{tag}.jsonl", model / f"{tag}.safetensors"
    r = run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", steps, "--seed", 11, "--weights", model / "init.safetensors",
             "--metrics", m, "--save", w])
    return [json.loads(l) for l in m.read_text().splitlines()], read_st(w), r.stderr


def test_static_scale_matches_unscaled_bit_for_bit(model):
    plain = train(model, compile_plan(model, "plain"), 8, "plain")
    static = train(model, compile_plan(model, "static", "compute=bf16 loss-scale=static:4096"),
                   8, "static")
    assert [m["loss"] for m in plain[0]] == [m["loss"] for m in static[0]]
    assert [m["grad_norm"] for m in plain[0]] == [m["grad_norm"] for m in static[0]]
    assert all(m["loss_scale"] == 4096 for m in static[0])
    assert plain[1] == static[1]


def test_dynamic_from_2_40_skips_then_trains(model):
    plan = compile_plan(model, "dyn", "compute=fp16 master=f32 loss-scale=dynamic "
                        "initial-scale=1099511627776 backoff-factor=0.5 growth-interval=1000")
    rows, _, err = train(model, plan, 40, "dyn")
    scale, skipped = 2.0 ** 40, 0
    for i, r in enumerate(rows):
        assert r["loss_scale"] == scale, (i, r)
        over = r["grad_norm"] * scale > 65504
        assert r["skipped"] == over, (i, r)
        if over:
            scale *= 0.5
            skipped += 1
    assert rows[0]["skipped"] and skipped >= 10 and skipped < len(rows)
    assert "gradient overflow at loss scale 1.09951e+12" in err
    # The skipped prefix left the initial parameters as they were.
    first = next(i for i, r in enumerate(rows) if not r["skipped"])
    _, w, _ = train(model, plan, first, "dyn-prefix")
    assert w == read_st(model / "init.safetensors")

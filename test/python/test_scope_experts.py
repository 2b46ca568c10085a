"""MegaScope's view of MoE expert load: a run with --probe-db records every
MoE layer's tokens per expert each step (reduction "experts", rank 0, the
step's global counts), equal to metrics.jsonl's expert_tokens (which
test_moe_e2e.py checks against PyTorch's routing); mapp-scope serves them
and the page draws them (headless Chromium)."""

import json
import os
import shutil
import sqlite3
import struct
import subprocess

import pytest

from conftest import ROOT
from conftest import require_tool
from scope_ref import CORPUS

BROWSER_DIR = os.path.join(ROOT, "test", "Tools", "mapp-scope", "browser")
STEPS = 4


def train_moe(tmp_path, pipeline=None):
    """Tiny MoE GPT (examples/gpt-moe-tiny.json), STEPS steps with metrics
    and a probe store; returns (metrics rows, store path)."""
    mlir, train, plan = (tmp_path / n for n in ("m.mlir", "t.mlir", "p.mplan"))
    subprocess.run([require_tool("mapp-translate"), "--import-gpt-config",
                    os.path.join(ROOT, "examples", "gpt-moe-tiny.json"), "-o", mlir], check=True)
    passes = ([f"--mapp-train-pipeline={pipeline} lr=1e-3"] if pipeline else
              ["-mapp-autodiff", "-mapp-optimizer=lr=1e-3"])
    subprocess.run([require_tool("mapp-opt"), mlir, *passes, "-o", train], check=True,
                   capture_output=True)
    subprocess.run([require_tool("mapp-translate"), "--mapp-to-plan", train, "-o", plan], check=True)
    db, metrics = tmp_path / "scope.sqlite", tmp_path / "m.jsonl"
    subprocess.run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
                    "--steps", str(STEPS), "--quiet", "--metrics", metrics,
                    "--probe-db", db], check=True)
    return [json.loads(l) for l in metrics.read_text().splitlines()], db


def stored_counts(db):
    """{layer: [counts of step 0, 1, ...]} and the imbalance values."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT p.point, s.step, s.rank, s.value, s.shape, s.data FROM samples s "
        "JOIN probes p ON p.run_id=s.run_id AND p.probe_id=s.probe_id AND p.rank=s.rank "
        "WHERE s.reduction='experts' ORDER BY p.point, s.step").fetchall()
    counts, imbalance = {}, {}
    for point, step, rank, value, shape, data in rows:
        assert rank == 0
        (e,) = json.loads(shape)
        c = [int(x) for x in struct.unpack(f"{e}f", data)]
        assert len(counts.setdefault(point, [])) == step
        counts[point].append(c)
        imbalance.setdefault(point, []).append(value)
    return counts, imbalance


def check_against_metrics(metrics, db):
    counts, imbalance = stored_counts(db)
    want = {}
    for m in metrics:
        for layer, c in m["expert_tokens"].items():
            want.setdefault(layer, []).append(c)
    assert want and counts == want
    for layer, steps in want.items():
        for c, v in zip(steps, imbalance[layer]):
            assert v == pytest.approx(max(c) * len(c) / sum(c), rel=1e-12)
    return want, imbalance


def test_expert_load_recorded_per_layer_and_step(tmp_path):
    metrics, db = train_moe(tmp_path)
    want, _ = check_against_metrics(metrics, db)
    assert len(want) == 2 and all(len(v) == STEPS for v in want.values())


@pytest.mark.parametrize("pipeline", ["dp=2", "pp=2 microbatches=2"])
def test_expert_load_is_the_global_count(tmp_path, pipeline):
    # dp 2: rank 0 records what the dp group routed; pp 2: layer 1 lives on
    # stage 1, and rank 0 still records both layers, as the metrics line.
    metrics, db = train_moe(tmp_path, pipeline)
    want, _ = check_against_metrics(metrics, db)
    assert len(want) == 2


def test_page_draws_expert_load(tmp_path):
    if not shutil.which("node") or not os.path.exists("/usr/bin/chromium"):
        pytest.skip("node or Debian chromium missing (scripts/setup.sh installs them)")
    if not os.path.isdir(os.path.join(BROWSER_DIR, "node_modules", "playwright-core")):
        pytest.skip("playwright-core not installed (scripts/setup.sh installs it)")
    metrics, db = train_moe(tmp_path)
    want, imbalance = check_against_metrics(metrics, db)
    server = subprocess.Popen([require_tool("mapp-scope"), "serve", "--db", db, "--port", "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().split()[-1]
        r = subprocess.run(["node", "scope-experts.mjs", url], cwd=BROWSER_DIR,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert res["errors"] == []
    assert sorted(res["layers"]) == sorted(want)
    for layer, view in res["layers"].items():
        last = want[layer][-1]
        assert view["bars"] == last  # the latest step's rows per expert
        assert view["info"].startswith(f"step {STEPS - 1}: {sum(last)} rows over {len(last)} experts")
        assert [p[0] for p in view["imbalance"]] == list(range(STEPS))
        assert [p[1] for p in view["imbalance"]] == pytest.approx(imbalance[layer], rel=1e-12)

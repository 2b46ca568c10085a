"""mapp-run --calibrate (docs/auto-parallel.md, "Calibration"): the profile
it writes parses (mapp-opt's search and mapp-sim read it without a
warning), every rate is positive and finite, the per-op overhead and the
link latency are of sane orders of magnitude, its GEMM rate agrees with
PyTorch timing the same fp32 product on as many threads (a ratio within one
test: both run on the same busy cores), and bad command lines fail with a
clear message."""

import json
import math
import os
import subprocess
import time

import pytest

from conftest import ROOT, require_tool

AGREE = os.path.join(ROOT, "test", "Tools", "mapp-sim", "Inputs")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120,
                          **kw)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """One short calibration (one thread, a 3 s budget) shared by the
    tests; its wall time too."""
    mapp_run = require_tool("mapp-run")
    path = tmp_path_factory.mktemp("calib") / "profile.json"
    t0 = time.monotonic()
    r = run([mapp_run, "--calibrate", "--threads", "1",
             "--calibrate-seconds", "3", "-o", str(path)])
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "gemm skinny" in r.stderr and "wrote" in r.stderr, r.stderr
    return path, json.loads(path.read_text()), wall


def test_rates_positive_and_sane(profile):
    _, p, wall = profile
    assert p["device"] == "cpu"
    rates = [p["gemm_tflops"]["f32"], p["peak_tflops"], p["mem_gbps"],
             p["attention_efficiency"], p["memory_gib"]]
    for link in ("intra", "inter", "p2p"):
        rates += [p["links"][link]["gbps"], p["links"][link]["latency_us"]]
    assert all(math.isfinite(x) and x > 0 for x in rates), p
    # The CPU backend computes fp32 only.
    assert p["gemm_tflops"]["bf16"] == 0 and p["gemm_tflops"]["fp8"] == 0
    assert p["gemm_tflops"]["f32"] <= p["peak_tflops"]
    assert 0 < p["attention_efficiency"] <= 1
    # A kernel call costs between a nanosecond and a millisecond; a message
    # between the threads of one process between 10 ns and 10 ms.
    assert 1e-3 < p["op_overhead_us"] < 1e3, p["op_overhead_us"]
    for link in ("intra", "p2p"):
        assert 1e-2 < p["links"][link]["latency_us"] < 1e4, p["links"]
    # A message between threads is copied in memory (eagerly by the sender,
    # then into the receiver's buffer): its rate is of the order of the
    # streaming add's, a different kernel.
    ratio = p["links"]["p2p"]["gbps"] / 8 / p["mem_gbps"]
    assert 0.05 < ratio < 50, (p["links"]["p2p"], p["mem_gbps"])
    # The thread world's collectives are shared memory (LocalComm.cpp).
    assert p.get("collectives") == "shared-memory", p["measured"]["comm"]
    assert p["measured"]["comm"]["ranks"] >= 2
    # The budget holds loosely (3 s asked; fixed communicator trials).
    assert wall < 40, wall


def test_gemm_rates_hold_every_class(profile):
    """gemm_rates: one point per fp32 class measured, at its smallest
    dimension, in increasing order, each the class's measured rate (the
    search and mapp-sim price each product at its size's rate from them);
    the peak bounds them all."""
    _, p, _ = profile
    measured = {min(g["m"], g["n"], g["k"]): g["tflops"]
                for g in p["measured"]["gemm"] if g["dtype"] == "f32"}
    table = p["gemm_rates"]["f32"]
    assert [d for d, _ in table] == sorted(measured) == [32, 64, 128, 512, 1024]
    for d, t in table:
        assert t == pytest.approx(measured[d])
        assert 0 < t <= p["peak_tflops"] * (1 + 1e-9)
    # The activation function (tanh GELU reads and writes 8 bytes an
    # element) never beats the streaming add's bandwidth by more than the
    # caches could explain.
    assert 0 < p["activation_gelems"] < 4 * p["mem_gbps"] / 8, p


def skinny_f32(p):
    return next(x for x in p["measured"]["gemm"]
                if x["class"] == "skinny" and x["dtype"] == "f32")


def torch_tflops(g):
    """torch's matmul of the same shape on one thread, best of 15."""
    code = f"""
import time, torch
torch.set_num_threads(1)
a = torch.rand({g['m']}, {g['k']}); b = torch.rand({g['k']}, {g['n']})
torch.matmul(a, b)
best = 1e9
for _ in range(15):
    t = time.perf_counter(); torch.matmul(a, b); best = min(best, time.perf_counter() - t)
print(2.0 * {g['m']} * {g['n']} * {g['k']} / best / 1e12)
"""
    r = run(["/usr/bin/python3", "-c", code])
    if r.returncode != 0 and "No module named 'torch'" in r.stderr:
        pytest.skip("torch is not installed")
    assert r.returncode == 0, r.stderr
    return float(r.stdout)


def test_gemm_rate_matches_torch(profile, tmp_path):
    """The skinny class's rate (the gemm_tflops.f32 key) against torch's
    matmul of the same shape on one thread. A neighbour's load only lowers
    a best-of rate: outside the band, both sides are measured again (up to
    two more rounds) and each side's best counts, so a busy moment on one
    side does not fail the test, while a wrong FLOP count still does."""
    _, p, _ = profile
    g = skinny_f32(p)
    assert g["tflops"] == pytest.approx(p["gemm_tflops"]["f32"])
    ours, theirs = [g["tflops"]], [torch_tflops(g)]
    for again in range(2):
        if 0.2 < max(ours) / max(theirs) < 5:
            break
        path = tmp_path / f"again{again}.json"
        r = run([require_tool("mapp-run"), "--calibrate", "--threads", "1",
                 "--calibrate-seconds", "3", "-o", str(path)])
        assert r.returncode == 0, r.stderr
        ours.append(skinny_f32(json.loads(path.read_text()))["tflops"])
        theirs.append(torch_tflops(g))
    ratio = max(ours) / max(theirs)
    assert 0.2 < ratio < 5, (ours, theirs)


def test_search_and_sim_read_it(profile, tmp_path):
    path, _, _ = profile
    opt = require_tool("mapp-opt")
    translate = require_tool("mapp-translate")
    sim = require_tool("mapp-sim")
    mlir = tmp_path / "m.mlir"
    r = run([translate, "--import-gpt-config",
             os.path.join(AGREE, "agree-gpt.json"), "-o", str(mlir)])
    assert r.returncode == 0, r.stderr
    # The search on a cpu cluster: priced with the file, no kind warning.
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"device": "cpu", "devices_per_node": 2}))
    r = run([opt, str(mlir), "--mapp-auto-parallel=world=2 global-batch=8 "
             f"search-only=true top=3 cluster={cluster} profile={path}",
             "-o", os.devnull])
    assert r.returncode == 0, r.stderr
    assert f"profile {path}" in r.stderr, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    # mapp-sim replays a plan with it.
    plan = tmp_path / "dp.mplan"
    lowered = run([opt, str(mlir), "--mapp-train-pipeline=dp=2 microbatches=2",
                   "-mapp-plan-memory"])
    assert lowered.returncode == 0, lowered.stderr
    r = run([translate, "--mapp-to-plan", "-o", str(plan)],
            input=lowered.stdout)
    assert r.returncode == 0, r.stderr
    r = run([sim, str(plan), "--profile", str(path), "--json"])
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    assert json.loads(r.stdout)[0]["step_us"] > 0


CORPUS = os.path.join(ROOT, "data", "gpt", "news-1k.jsonl")


def tiny_gpt_plan(tmp_path, layers):
    """A one-rank GPT of `layers` layers too small for its kernels to do
    work (hidden 8, 4 tokens): a step is mostly per-instruction costs."""
    cfg = tmp_path / f"tiny{layers}.json"
    cfg.write_text(json.dumps({
        "variant": "gpt", "num_layers": layers, "hidden_size": 8,
        "num_attention_heads": 1, "seq_length": 4, "vocab_size": 256,
        "micro_batch_size": 1, "tie_embeddings": True}))
    mlir, plan = tmp_path / f"tiny{layers}.mlir", tmp_path / f"tiny{layers}.mplan"
    r = run([require_tool("mapp-translate"), "--import-gpt-config", str(cfg),
             "-o", str(mlir)])
    assert r.returncode == 0, r.stderr
    lowered = run([require_tool("mapp-opt"), str(mlir),
                   "--mapp-train-pipeline=dp=1 microbatches=1",
                   "-mapp-plan-memory"])
    assert lowered.returncode == 0, lowered.stderr
    r = run([require_tool("mapp-translate"), "--mapp-to-plan", "-o", str(plan)],
            input=lowered.stdout)
    assert r.returncode == 0, r.stderr
    return plan


def run_plan(plan, tmp_path, *flags):
    r = run([require_tool("mapp-run"), str(plan), "--data", CORPUS,
             "--tokenizer", "bytes", "--threads", "1", "--quiet", *flags])
    assert r.returncode == 0, r.stderr


def instrs_per_step(plan, tmp_path):
    """The instructions one step runs: the records of a traced step (a plan
    without trace regions records every instruction; the data load and the
    region around the optimizer are not instructions)."""
    trace = tmp_path / (plan.stem + "-trace")
    run_plan(plan, tmp_path, "--steps", "1", "--trace-dir", str(trace))
    (f,) = list(trace.glob("*.jsonl"))
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    return sum(1 for x in recs if x.get("step") == 0
               and x.get("cat") in ("compute", "optimizer", "comm")
               and x.get("name") != "optimizer")


def best_step_us(plan, tmp_path):
    metrics = tmp_path / (plan.stem + "-metrics.jsonl")
    run_plan(plan, tmp_path, "--steps", "400", "--metrics", str(metrics))
    return 1e3 * min(json.loads(line)["step_ms"]
                     for line in metrics.read_text().splitlines())


def sim_step_us(plan, profile_path):
    r = run([require_tool("mapp-sim"), str(plan), "--profile",
             str(profile_path), "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]["step_us"]


def test_per_op_overhead_against_a_tiny_gpt(profile, tmp_path):
    """op_overhead_us is the executor's cost of one more instruction (an
    `add` chain's slope, CalibrateExec.h). Checked against mapp-run on a
    tiny GPT of 1 and 5 layers: the step time per extra instruction (their
    best steps' difference over their instruction counts' difference, so
    the per-step costs cancel) is at least the `add` chain's (no kernel does
    less) and at most 20x it (kernels at these sizes do almost nothing);
    and mapp-sim with the profile predicts the per-layer step time within
    3x (the CPU default's 6 us per instruction predicts ~30x; the profile is
    measured before the runs, and a CI rehearsal on 2 busy cores once read
    0.43 where 2x had been the bar). Best of up to three alternating rounds
    of 400 steps: a neighbour's load only slows a round."""
    path, p, _ = profile
    per_op = p["op_overhead_us"]
    oo = p["measured"]["op_overhead"]
    assert oo["kernel"] == "add" and oo["ops"][0] < oo["ops"][1]
    small, large = tiny_gpt_plan(tmp_path, 1), tiny_gpt_plan(tmp_path, 5)
    n_small, n_large = (instrs_per_step(x, tmp_path) for x in (small, large))
    assert n_large > n_small + 100, (n_small, n_large)
    predicted = sim_step_us(large, path) - sim_step_us(small, path)
    best = {small: math.inf, large: math.inf}
    for _ in range(3):
        for plan in (small, large):
            best[plan] = min(best[plan], best_step_us(plan, tmp_path))
        measured = best[large] - best[small]
        per_instr = measured / (n_large - n_small)
        if 1 <= per_instr / per_op <= 20 and 1 / 3 < predicted / measured < 3:
            break
    assert 1 <= per_instr / per_op <= 20, (per_instr, per_op, best)
    assert 1 / 3 < predicted / measured < 3, (predicted, measured, best)


@pytest.mark.parametrize("args,message", [
    (["plan.mplan", "-o", "{tmp}/p.json"], "takes no plan"),
    ([], "needs -o FILE"),
    (["--backend", "tpu", "-o", "{tmp}/p.json"], "--backend must be cpu or cuda"),
    (["--calibrate-seconds", "0", "-o", "{tmp}/p.json"],
     "--calibrate-seconds needs a number of seconds in (0, 600]"),
    (["--calibrate-seconds", "-2", "-o", "{tmp}/p.json"],
     "--calibrate-seconds needs"),
    (["--comm", "nccl", "-o", "{tmp}/p.json"], "--comm must be local or mpi"),
    (["--steps", "3", "-o", "{tmp}/p.json"], "'--steps' is not a --calibrate flag"),
    (["-o", "{tmp}"], "is a directory"),
    (["-o", "{tmp}/no/such/p.json"], "does not exist"),
])
def test_bad_command_lines(args, message, tmp_path):
    mapp_run = require_tool("mapp-run")
    r = run([mapp_run, "--calibrate"] +
            [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.returncode != 0, r.stderr
    assert message in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()

#!/usr/bin/env python3
"""MegaDPP on CPU ranks: static 1F1B, static dfc/bfc and adaptive, with and
without one slow link, side by side from one run.

Compiles a small GPT (8 layers, hidden 64, seq 64, byte vocab) for pp=4
(chunks=1: 1F1B; chunks=2: interleaved = dfc; mapp-adaptive-plan makes the
bfc and adaptive plans), trains STEPS steps of each over --comm=local and
--comm=mpi (4 ranks), and prints per run the median step time (steps after
the first two), the peak in-flight activation stash per rank (the scheduler's
report) and the ratio to static 1F1B. The slow link: link-delay 1->0 (the
gradients into the first stage) of US microseconds from step 2 on.

usage: bench/dpp/run.py [--steps N] [--us U] [--comms local,mpi] [--out DIR]
                        [--backend cpu|cuda] [--prepare-only] [--plans DIR]
                        [--rounds R] [--sim] [--mem-cap-mb M]
Needs build/bin/{mapp-run,mapp-adaptive-plan} and mapp-opt/mapp-translate
(build/bin, or MAPP_OPT / MAPP_TRANSLATE / MAPP_RUN). On a machine without
the compiler (the GPU machine): `--prepare-only --out DIR` here, then
`--plans DIR` there (the plans DIR holds are used as they are).
`--backend cuda` runs the 4 rank-threads on the one GPU (device-local
communicator). `--sim` adds mapp-sim's prediction of every row (MAPP_SIM or
build/bin/mapp-sim): the modeled device speed is calibrated once per comm on
the measured fault-free 1F1B row (FLOP and byte rates scaled together, so
that row's prediction equals its measurement); every other row is a
prediction, printed with its error against the measurement.
`--mem-cap-mb M` (default 4.8; 0: off) adds the row `adaptive@cap`: the
adaptive plan under `--mem-cap` M MB per rank, between dfc's in-flight stash
(3.7 MB) and bfc's (5.9 MB), so breadth-first admits a microbatch only when
backwards free its stash; the last line counts ranks whose peak stash
passed the cap (must be 0).
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAPP_BIN", ROOT / "build" / "bin"))
CORPUS = ROOT / "data" / "gpt" / "news-1k.jsonl"
CFG = {"variant": "gpt", "num_layers": 8, "hidden_size": 64,
       "num_attention_heads": 4, "seq_length": 64, "vocab_size": 256,
       "micro_batch_size": 1, "tie_embeddings": True}
OPT = "optimizer=adamw lr=0.001"
MICRO = 8


def tool(name, env=None):
    p = os.environ.get(env) if env else None
    return p or str(BIN / name)


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}")
    return r


def compile_plans(d):
    (d / "cfg.json").write_text(json.dumps(CFG))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    run(["/usr/bin/python3", "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", d / "cfg.json", "-o", d / "model.mlir", "--seed", 7], env=env)
    plans = {}
    for chunks, sched, name in [(1, "1f1b", "1f1b"), (2, "interleaved", "dfc")]:
        pipe = (f"--mapp-train-pipeline=tp=1 pp=4 dp=1 chunks={chunks} "
                f"microbatches={MICRO} schedule={sched} {OPT}")
        run([tool("mapp-opt", "MAPP_OPT"), d / "model.mlir", pipe, "-o", d / f"{name}.mlir"])
        run([tool("mapp-translate", "MAPP_TRANSLATE"), "--mapp-to-plan", d / f"{name}.mlir",
             "-o", d / f"{name}.mplan"])
        plans[name] = d / f"{name}.mplan"
    # dfc through the tool too, so every chunks=2 plan has stash_bytes.
    for mode in ("dfc", "bfc", "adaptive"):
        out = d / f"{mode}-t.mplan"
        run([tool("mapp-adaptive-plan"), plans["dfc"], out, f"mode={mode}"])
        plans[mode] = out
    out = d / "1f1b-t.mplan"
    run([tool("mapp-adaptive-plan"), plans["1f1b"], out, "mode=dfc"])
    plans["1f1b"] = out
    return plans


NAMES = ("1f1b", "dfc", "bfc", "adaptive")
CAPPED = "adaptive@cap"


def train(plan, comm, steps, fault, d, tag, backend, cap=0):
    metrics = d / f"{tag}.jsonl"
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
            "--seed", 1, "--metrics", metrics, "--threads", 1, "--quiet",
            f"--backend={backend}"]
    if fault:
        args += ["--inject", fault]
    if cap:
        args += ["--mem-cap", cap]
    if comm == "mpi":
        cmd = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe",
               "-np", 4, tool("mapp-run", "MAPP_RUN"), *args, "--comm=mpi"]
    else:
        cmd = [tool("mapp-run", "MAPP_RUN"), *args, "--comm=local"]
    r = run(cmd, timeout=1200)
    ms = [json.loads(l)["step_ms"] for l in metrics.read_text().splitlines()]
    losses = [json.loads(l)["loss"] for l in metrics.read_text().splitlines()]
    peaks = [int(x) for x in re.findall(r"peak stash (\d+) bytes", r.stderr)]
    sw = re.search(r"rank 0 scheduler \w+: .*?, (\d+) switches", r.stderr)
    switches = int(sw.group(1)) if sw else 0
    return statistics.median(ms[2:]), max(peaks) if peaks else 0, losses[-1], switches


def simulate(plans, fault, steps, speed, cap=0):
    """mapp-sim's step time (ms) of every schedule, devices at `speed` x
    the simulator's default rates (with a cap: adaptive under it, as
    CAPPED)."""
    cmd = [tool("mapp-sim", "MAPP_SIM"), plans["1f1b"], plans["adaptive"],
           "--steps", min(steps, 4), "--json",
           "--tflops", 100 * speed, "--mem-gbps", 2000 * speed,
           "--latency-us", 20]
    cmd += ["--compare", "adaptive", "--mem-cap", cap] if cap else \
        ["--compare", ",".join(NAMES)]
    if fault:
        cmd += ["--inject", fault.split(",from-step")[0]]
    rows = json.loads(run(cmd).stdout)
    if cap:
        return {CAPPED: rows[0]["step_us"] / 1000}
    return {r["schedule"]: r["step_us"] / 1000 for r in rows}


def calibrated_speed(plans, steps, measured_ms):
    """The device speed at which the fault-free 1F1B prediction equals the
    measurement (compute scales as 1/speed; two fixed-point rounds absorb
    the fixed link latency)."""
    speed = 1.0
    for _ in range(3):
        speed *= simulate(plans, None, steps, speed)["1f1b"] / measured_ms
    return speed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--us", type=int, default=30000)
    ap.add_argument("--comms", default="local,mpi")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench-dpp"))
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--prepare-only", action="store_true",
                    help="compile the plans into --out and stop")
    ap.add_argument("--plans", help="a folder --prepare-only filled")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate every schedule this many times (median)")
    ap.add_argument("--sim", action="store_true",
                    help="add mapp-sim's calibrated prediction of each row")
    ap.add_argument("--mem-cap-mb", type=float, default=4.8,
                    help="the adaptive@cap row's --mem-cap (MB; 0: no row)")
    a = ap.parse_args()
    if a.mem_cap_mb < 0:
        sys.exit("--mem-cap-mb must be >= 0 (0: no capped row)")
    cap = int(a.mem_cap_mb * 1e6)
    names = NAMES + ((CAPPED,) if cap else ())
    d = pathlib.Path(a.out)
    d.mkdir(parents=True, exist_ok=True)
    if a.plans:
        plans = {n: pathlib.Path(a.plans) / f"{n}-t.mplan" for n in NAMES}
        missing = [str(p) for p in plans.values() if not p.exists()]
        if missing:
            sys.exit("--plans: missing " + ", ".join(missing))
    else:
        plans = compile_plans(d)
    if a.prepare_only:
        print(f"plans in {d}: " + " ".join(p.name for p in plans.values()))
        return
    fault = f"link-delay:src=1,dst=0,us={a.us},from-step=2"
    comms = [c for c in a.comms.split(",")
             if c != "mpi" or shutil.which("mpirun")]
    # Rounds alternate the schedules, so a slow spell of a shared host
    # falls on all of them; each row is the median over the rounds.
    runs = {}
    for _ in range(a.rounds):
        for comm in comms:
            for slow in (False, True):
                for name in names:
                    plan = plans["adaptive" if name == CAPPED else name]
                    runs.setdefault((comm, slow, name), []).append(
                        train(plan, comm, a.steps, fault if slow else None,
                              d, f"{comm}-{name}-{int(slow)}", a.backend,
                              cap if name == CAPPED else 0))
    rows = []
    for comm in comms:
        for slow in (False, True):
            base = None
            for name in names:
                got = runs[(comm, slow, name)]
                ms = statistics.median(r[0] for r in got)
                peak = max(r[1] for r in got)
                sw = max(r[3] for r in got)
                base = base or ms
                rows.append((comm, "slow 1->0" if slow else "none", name, ms,
                             base / ms, peak, sw, got[-1][2]))
    print(f"backend {a.backend}, pp=4, {MICRO} microbatches, GPT {CFG['num_layers']}L h{CFG['hidden_size']} "
          f"s{CFG['seq_length']}, {a.steps} steps (median of steps 2..; median of "
          f"{a.rounds} alternated rounds), slow link = {fault}")
    predicted = {}
    if a.sim:
        for comm in comms:
            base = next(r[3] for r in rows if r[0] == comm and r[1] == "none"
                        and r[2] == "1f1b")
            speed = calibrated_speed(plans, a.steps, base)
            print(f"mapp-sim calibration ({comm}): devices at {speed:.5f}x the "
                  f"default rates (fault-free 1f1b = {base:.1f} ms)")
            for slow in (False, True):
                pred = simulate(plans, fault if slow else None, a.steps, speed)
                if cap:
                    pred.update(simulate(plans, fault if slow else None,
                                         a.steps, speed, cap))
                for name in names:
                    predicted[(comm, slow, name)] = pred[name]
    print(f"{'comm':5} {'fault':10} {'schedule':12} {'step ms':>9} {'vs 1f1b':>8} "
          f"{'peak stash':>11} {'switches':>8} {'last loss':>10}"
          + (f" {'sim ms':>9} {'sim err':>8}" if a.sim else ""))
    for comm, fault_s, name, ms, speed, peak, sw, loss in rows:
        line = (f"{comm:5} {fault_s:10} {name:12} {ms:9.1f} {speed:7.2f}x "
                f"{peak / 1e6:9.2f}MB {sw:8d} {loss:10.5f}")
        if a.sim:
            p = predicted[(comm, fault_s != "none", name)]
            line += f" {p:9.1f} {100 * (p / ms - 1):+7.1f}%"
        print(line)
    if cap:
        over = sum(r[5] > cap for r in rows if r[2] == CAPPED)
        print(f"{CAPPED}: --mem-cap {cap} bytes per rank; rows whose peak "
              f"stash passed it: {over}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""mapp-run --monitor's cost: the same 8-rank job (tp2 x pp2 x dp2, the
test_monitor.py model) with the monitor on and off, alternated PAIRS times
in one invocation; prints each pair's wall times and the median ratio of
median step time (from --metrics step_ms). Not asserted in CI (2 busy cores).
`--comm mpi` runs the 8 ranks as MPI processes (mpirun -np 8), where the
summaries travel over the job's communicator. `--baseline DIR` times a
second build's binaries (e.g. main's, to compare a change with) in the same
pairs, interleaved, so both builds see the same host drift.
`--cost-window N` measures inside each run instead (mapp-run --monitor-cost
N: windows of N steps alternate without and with the monitor, so the
machine's drift and each run's process placement reach both alike): PAIRS
runs, each one's cost line, and their median. Pairs of runs spread ±3% a
pair on the 16-vCPU GPU host (2026-12-05/06), wider than the 1% in question.

  /usr/bin/python3 bench/scan/monitor_overhead.py [--steps N] [--pairs P]
      [--comm local|mpi] [--size tiny|mid] [--baseline DIR] [--cost-window N]
"""
import argparse, json, os, pathlib, shutil, statistics, subprocess, tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAPP_BIN", REPO / "build" / "bin"))
LAYOUT = ["optimizer=adamw", "lr=0.01", "trace=1", "microbatches=4",
          "tp=2", "pp=2", "dp=2"]
# tiny: the test_monitor.py model, ~60 ops of a few us each per rank and
# step (per-op tracing at its most expensive, relatively); mid: ops 16x
# larger, still well under a second a step.
SIZES = {"tiny": ["vocab=256", "hidden=64", "ffn=128", "batch=4", "seq=32"],
         "mid": ["vocab=256", "hidden=256", "ffn=1024", "batch=8",
                 "seq=64"]}


def median_step_ms(bin_dir, plan, work, steps, monitor, comm):
    m = work / "m.jsonl"
    args = [bin_dir / "mapp-run", plan, "--data", REPO / "data/gpt/news-1k.jsonl",
            "--tokenizer", "bytes", "--steps", steps, "--quiet", "--threads",
            1, f"--comm={comm}", "--metrics", m]
    if monitor:
        args += ["--monitor", work / "a.jsonl"]
    if comm == "mpi":
        bind = ["--bind-to", "core"] if os.cpu_count() >= 8 else \
            ["--oversubscribe"]
        args = [shutil.which("mpirun"), "--allow-run-as-root", *bind,
                "-np", 8, *args]
    # The same address-space layout every run (ASLR off, inherited by the
    # ranks): per-process layout moved a rank's CPU time by up to 1.7x
    # between runs (docs/mapp-scan.md), noise an on/off pair would carry.
    if shutil.which("setarch"):
        args = ["setarch", os.uname().machine, "-R", *args]
    subprocess.run([str(a) for a in args], check=True, capture_output=True)
    ms = [json.loads(l)["step_ms"] for l in m.read_text().splitlines()]
    return statistics.median(ms[2:])  # without the first-touch steps


def within_run_cost(bin_dir, plan, work, steps, window, comm):
    """mapp-run --monitor-cost WINDOW: the run's own cost figure (%)."""
    args = [bin_dir / "mapp-run", plan, "--data", REPO / "data/gpt/news-1k.jsonl",
            "--tokenizer", "bytes", "--steps", steps, "--quiet", "--threads", 1,
            f"--comm={comm}", "--monitor", work / "a.jsonl",
            "--monitor-cost", window]
    if comm == "mpi":
        bind = ["--bind-to", "core"] if os.cpu_count() >= 8 else \
            ["--oversubscribe"]
        args = [shutil.which("mpirun"), "--allow-run-as-root", *bind,
                "-np", 8, *args]
    r = subprocess.run([str(a) for a in args], check=True, capture_output=True,
                       text=True)
    line = next(l for l in r.stderr.splitlines() if "monitor cost" in l)
    return float(line.split("monitor cost ")[1].split("%")[0]), line


def make_plan(bin_dir, plan, size):
    subprocess.run([str(bin_dir / "mapp-make-test-plan"), str(plan),
                    *SIZES[size], *LAYOUT], check=True, capture_output=True)


def summary(ratios):
    r = sorted(ratios)
    q1, q3 = r[len(r) // 4], r[(3 * len(r)) // 4]
    med = statistics.median(ratios)
    return (f"median ratio on/off {med:.4f} (overhead {100 * (med - 1):+.2f}%; "
            f"quartiles {q1:.4f}..{q3:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--comm", choices=("local", "mpi"), default="local")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--baseline", type=pathlib.Path,
                    help="another build's bin dir, timed in the same pairs")
    ap.add_argument("--cost-window", type=int, default=0, metavar="N",
                    help="measure inside each run (mapp-run --monitor-cost N)")
    a = ap.parse_args()
    if a.cost_window:
        work = pathlib.Path(tempfile.mkdtemp(prefix="mapp-monov-"))
        make_plan(BIN, work / "p.mplan", a.size)
        costs = []
        for i in range(a.pairs):
            cost, line = within_run_cost(BIN, work / "p.mplan", work, a.steps,
                                         a.cost_window, a.comm)
            costs.append(cost)
            print(f"run {i}: {line.split('mapp-run: ')[-1]}", flush=True)
        print(f"within-run monitor cost: median {statistics.median(costs):+.2f}% "
              f"over {len(costs)} runs (each {a.steps} steps, windows of "
              f"{a.cost_window}; {a.comm}, {a.size})")
        shutil.rmtree(work, ignore_errors=True)
        return
    work = pathlib.Path(tempfile.mkdtemp(prefix="mapp-monov-"))
    builds = {"": BIN}
    if a.baseline:
        builds = {"this build: ": BIN, "baseline: ": a.baseline}
    plans = {}
    for name, bin_dir in builds.items():
        plans[name] = work / f"p{len(plans)}.mplan"
        make_plan(bin_dir, plans[name], a.size)
    ratios = {name: [] for name in builds}
    for i in range(a.pairs):
        order = list(builds.items())
        for name, bin_dir in order[::-1] if i % 2 else order:
            def run(monitor):
                return median_step_ms(bin_dir, plans[name], work, a.steps,
                                      monitor, a.comm)
            # Alternate which runs first, so drift over the invocation
            # cancels.
            if i % 2:
                on = run(True)
                off = run(False)
            else:
                off = run(False)
                on = run(True)
            ratios[name].append(on / off)
            print(f"pair {i}: {name}off {off:.3f} ms/step, on {on:.3f} "
                  f"ms/step, ratio {on / off:.4f}", flush=True)
    for name in builds:
        print(f"{name}{summary(ratios[name])}, {a.comm}, {a.size})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

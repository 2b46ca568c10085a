#!/usr/bin/python3
"""mapp-run --monitor's cost: the same 8-rank job (tp2 x pp2 x dp2, the
test_monitor.py model) with the monitor on and off, alternated PAIRS times
in one invocation; prints each pair's wall times and the median ratio of
median step time (from --metrics step_ms). Not asserted in CI (2 busy cores).
`--comm mpi` runs the 8 ranks as MPI processes (mpirun -np 8), where the
summaries travel over the job's communicator.

  /usr/bin/python3 bench/scan/monitor_overhead.py [--steps N] [--pairs P]
      [--comm local|mpi]
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


def median_step_ms(plan, work, steps, monitor, comm):
    m = work / "m.jsonl"
    args = [BIN / "mapp-run", plan, "--data", REPO / "data/gpt/news-1k.jsonl",
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--comm", choices=("local", "mpi"), default="local")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    a = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="mapp-monov-"))
    plan = work / "p.mplan"
    subprocess.run([str(BIN / "mapp-make-test-plan"), str(plan),
                    *SIZES[a.size], *LAYOUT],
                   check=True, capture_output=True)
    ratios = []
    for i in range(a.pairs):
        # Alternate which runs first, so drift over the invocation cancels.
        if i % 2:
            on = median_step_ms(plan, work, a.steps, True, a.comm)
            off = median_step_ms(plan, work, a.steps, False, a.comm)
        else:
            off = median_step_ms(plan, work, a.steps, False, a.comm)
            on = median_step_ms(plan, work, a.steps, True, a.comm)
        ratios.append(on / off)
        print(f"pair {i}: off {off:.3f} ms/step, on {on:.3f} ms/step, "
              f"ratio {on / off:.4f}")
    r = sorted(ratios)
    q1, q3 = r[len(r) // 4], r[(3 * len(r)) // 4]
    print(f"median ratio on/off {statistics.median(ratios):.4f} "
          f"(overhead {100 * (statistics.median(ratios) - 1):+.2f}%; "
          f"quartiles {q1:.4f}..{q3:.4f}, {a.comm}, {a.size})")


if __name__ == "__main__":
    main()

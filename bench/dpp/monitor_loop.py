#!/usr/bin/env python3
"""Does the live monitor's slow-link verdict help MegaDPP's adaptive
scheduler? (issue #23, "the loop to MegaDPP"). One run, side by side.

The pp=4 plans of bench/dpp/run.py (8 microbatches, dfc/bfc tables) train
STEPS steps on 4 CPU rank-threads with link-delay 1->0 of US microseconds in
steps FROM..TO. Rows:
  own          adaptive, its own link estimate (the default)
  own+monitor  adaptive, own estimate and --monitor --monitor-to-dpp
  monitor      adaptive with its own estimate off (slow_link_ratio 1e9), fed
               only by the monitor's verdicts
  1f1b         static 1F1B with the same fault (the reference)
Per row: rank 0's first switch to bfc and last back to dfc (steps), mean
step time in the fault window and after it, and against 1F1B.

usage: bench/dpp/monitor_loop.py [--steps 24] [--us 30000] [--from 6] [--to 16]
"""
import argparse
import json
import pathlib
import re
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run as dpp  # noqa: E402


def train(plan, steps, fault, d, tag, extra=()):
    metrics = d / f"{tag}.jsonl"
    r = dpp.run([dpp.tool("mapp-run", "MAPP_RUN"), plan, "--data", dpp.CORPUS,
                 "--tokenizer", "bytes", "--steps", steps, "--seed", 1,
                 "--metrics", metrics, "--threads", 1, "--comm=local",
                 "--inject", fault, *extra], timeout=1200)
    ms = [json.loads(l)["step_ms"] for l in metrics.read_text().splitlines()]
    to_bfc = [int(s) for s in re.findall(r"rank 0 step (\d+): scheduler dfc -> bfc", r.stderr)]
    to_dfc = [int(s) for s in re.findall(r"rank 0 step (\d+): scheduler bfc -> dfc", r.stderr)]
    return ms, to_bfc, to_dfc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--us", type=int, default=30000)
    ap.add_argument("--from", dest="start", type=int, default=6)
    ap.add_argument("--to", type=int, default=16)
    a = ap.parse_args()
    d = pathlib.Path(tempfile.mkdtemp(prefix="dpp-monitor-"))
    plans = dpp.compile_plans(d)
    deaf = d / "deaf.mplan"
    dpp.run([dpp.tool("mapp-adaptive-plan"), plans["dfc"], deaf, "mode=adaptive",
             "ratio=1e9"])
    fault = f"link-delay:src=1,dst=0,us={a.us},from-step={a.start},to-step={a.to}"
    mon = lambda tag: ["--monitor", d / f"{tag}-alerts.jsonl", "--monitor-to-dpp"]
    rows = [("1f1b", plans["1f1b"], ()), ("own", plans["adaptive"], ()),
            ("own+monitor", plans["adaptive"], mon("both")),
            ("monitor", deaf, mon("deaf"))]
    print(f"pp=4, 8 microbatches, link 1->0 +{a.us} us in steps {a.start}..{a.to - 1}, "
          f"{a.steps} steps, 4 CPU rank-threads")
    print(f"{'row':<12} {'->bfc':>6} {'->dfc':>6} {'fault ms':>9} {'after ms':>9} "
          f"{'fault vs 1f1b':>14}")
    base = None
    for name, plan, extra in rows:
        ms, to_bfc, to_dfc = train(plan, a.steps, fault, d, name, extra)
        fault_ms = statistics.mean(ms[a.start:a.to])
        after_ms = statistics.mean(ms[a.to + 3:]) if len(ms) > a.to + 3 else float("nan")
        base = base or fault_ms
        print(f"{name:<12} {to_bfc[0] if to_bfc else '-':>6} "
              f"{to_dfc[-1] if to_dfc else '-':>6} {fault_ms:9.1f} {after_ms:9.1f} "
              f"{base / fault_ms:13.2f}x")


if __name__ == "__main__":
    main()

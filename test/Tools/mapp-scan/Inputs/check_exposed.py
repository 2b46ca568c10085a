#!/usr/bin/env python3
"""Checks mapp-scan's exposed communication against mapp-sim's ground truth.

  check_exposed.py SIM_DIR REPORT [--tol 0.10] [--min-hidden F]
                   [--replay-line FILE]

SIM_DIR/sim-truth.json's "exposed_comm" holds what the simulator knows from
its own (true) times; REPORT is mapp-scan's report.json on the traces. Each
rank's total and each (rank, class) that carries at least 2% of the rank's
exposed time must agree within --tol, relative; so must the job's total
and each class's mean over ranks. --min-hidden F: the truth must hide at
least a fraction F of the dp all-reduce (the job overlaps it), and the
scan's hidden fraction must agree. --replay-line FILE: the stderr of
mapp-scan --replay-summaries on the job's summaries, whose "exposed
communication X ms per rank and step" must agree with the truth too.
Prints one line per check that failed, and "ok" at the end.
"""
import argparse
import json
import os
import re
import sys


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(b), 1e-9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sim_dir")
    ap.add_argument("report")
    ap.add_argument("--tol", type=float, default=0.10)
    ap.add_argument("--min-hidden", type=float)
    ap.add_argument("--replay-line")
    a = ap.parse_args()
    with open(os.path.join(a.sim_dir, "sim-truth.json")) as f:
        truth = json.load(f)["exposed_comm"]
    with open(a.report) as f:
        scan = json.load(f)["exposed_comm"]
    bad = []

    def check(what, got, want):
        if not close(got, want, a.tol):
            bad.append(f"{what}: scan {got:.4f} ms, truth {want:.4f} ms")

    check("total per rank and step", scan["exposed_ms_per_step"],
          truth["exposed_ms_per_step"])
    classes = {}
    for t in truth["ranks"]:
        r = t["rank"]
        s = scan["ranks"][r]
        check(f"rank {r}", s["exposed_ms_per_step"], t["exposed_ms_per_step"])
        for c, tc in t["classes"].items():
            classes.setdefault(c, [0.0, 0.0, 0.0, 0.0])
            sc = s["classes"].get(c, {"exposed_ms_per_step": 0.0,
                                      "comm_ms_per_step": 0.0})
            for k, v in enumerate((tc["exposed_ms_per_step"],
                                   sc["exposed_ms_per_step"],
                                   tc["comm_ms_per_step"],
                                   sc["comm_ms_per_step"])):
                classes[c][k] += v
            if tc["exposed_ms_per_step"] >= 0.02 * t["exposed_ms_per_step"]:
                check(f"rank {r} {c}", sc["exposed_ms_per_step"],
                      tc["exposed_ms_per_step"])
    for c, (te, se, tcomm, scomm) in classes.items():
        check(f"class {c}", se, te)
    if a.min_hidden is not None:
        te, se, tcomm, scomm = classes.get("dp", (0, 0, 0, 0))
        hidden = 1 - te / tcomm if tcomm else 0
        if hidden < a.min_hidden:
            bad.append(f"truth hides {hidden:.2f} of dp, not >= "
                       f"{a.min_hidden}: the job does not overlap")
        shidden = 1 - se / scomm if scomm else 0
        if abs(shidden - hidden) > a.tol * hidden:
            bad.append(f"dp hidden fraction: scan {shidden:.3f}, truth "
                       f"{hidden:.3f}")
    if a.replay_line:
        with open(a.replay_line) as f:
            m = re.search(r"exposed communication ([0-9.]+) ms per rank",
                          f.read())
        if not m:
            bad.append("no exposed-communication line in " + a.replay_line)
        else:
            check("monitor summaries (--replay-summaries)", float(m.group(1)),
                  truth["exposed_ms_per_step"])
    for b in bad:
        print("mismatch:", b)
    print("ok" if not bad else f"{len(bad)} mismatch(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

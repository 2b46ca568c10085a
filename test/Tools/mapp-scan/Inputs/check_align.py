"""Compares mapp-scan's recovered clocks with mapp-sim's ground truth.

usage: check_align.py SIM_DIR report.json TOL_US
For sample true times T across the run, every rank's local reading
local_r(T) is mapped through the fitted clock and compared with rank 0's
mapped reading of the same instant. Prints the worst error; exits 1 when it
exceeds TOL_US.
"""
import json
import sys

sim_dir, report, tol_us = sys.argv[1], sys.argv[2], float(sys.argv[3])
truth = json.load(open(sim_dir + "/sim-truth.json"))
rep = json.load(open(report))
span_ns = sum(truth["step_ms"]) * 1e6
clocks = {c["rank"]: c for c in truth["clocks"]}
fit = {c["rank"]: c for c in rep["alignment"]["ranks"]}


def local(r, t):
    c = clocks[r]
    return c["offset_ns"] + (1 + c["drift_ppm"] * 1e-6) * t


def mapped(r, x):
    f = fit[r]
    return (x - f["origin_ns"]) * (1 + f["drift_ppm"] * 1e-6) + f["offset_ns"]


worst = 0.0
for k in range(11):
    t = span_ns * k / 10
    ref = mapped(0, local(0, t))
    for r in clocks:
        worst = max(worst, abs(mapped(r, local(r, t)) - ref))
print("max alignment error: %.3f us (tolerance %.1f us)" % (worst / 1e3, tol_us))
sys.exit(0 if worst <= tol_us * 1e3 else 1)

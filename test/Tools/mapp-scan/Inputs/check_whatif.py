"""Checks mapp-scan's what-if prediction against re-simulation.

usage: check_whatif.py report.json faulty-truth.json clean-truth.json TOL
The true saving is the faulty run's mean step minus the clean run's (same
seed, so the same jitter); the prediction must be within TOL (a fraction).
"""
import json
import sys

rep = json.load(open(sys.argv[1]))
faulty = json.load(open(sys.argv[2]))["mean_step_ms"]
clean = json.load(open(sys.argv[3]))["mean_step_ms"]
tol = float(sys.argv[4])
pred = rep["what_if"]["saved_ms"]
true = faulty - clean
err = abs(pred - true) / max(true, 1e-9)
print("what-if saved: predicted %.3f ms, re-simulated %.3f ms, error %.1f%%"
      % (pred, true, 100 * err))
sys.exit(0 if err <= tol else 1)

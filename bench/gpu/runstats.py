"""Step metrics of mapp-run A/B runs (bench/gpu/planab.sh, fuse.sh): the
median step time after the warm-up steps and the largest relative loss
difference between two runs on the same seed and batches."""
import json
import statistics

WARMUP = 3


def steps(path):
    """The per-step records of a --metrics file ([] when it is missing)."""
    try:
        with open(path) as f:
            return [m for m in map(json.loads, filter(str.strip, f)) if "step_ms" in m]
    except OSError:
        return []


def median_step_ms(*runs):
    """Median step_ms over the runs, each without its warm-up steps (all of a
    run that is no longer than them)."""
    return statistics.median(x["step_ms"] for r in runs for x in r[WARMUP:] or r)


def max_rel_loss_diff(a, b):
    return max(abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
               for x, y in zip(a, b))

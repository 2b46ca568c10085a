"""bench/autopar's measurement files and issue 36's criteria (run.py's
analyze stage): merging the files of a measurement split over calls, and
judging one table of predicted against measured step times."""
import json
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_measured(files):
    """Merges measurement files (a call split by --models): the samples of
    each layout and probe concatenated."""
    merged = None
    for f in files:
        m = json.load(open(f))
        if not m.get("complete"):
            log(f"warning: {f} is incomplete (the call was cut off): "
                "layouts it did not reach are missing")
        if merged is None:
            merged = m
            continue
        if m["host"]["cpus"] != merged["host"]["cpus"]:
            sys.exit(f"run.py: {f} was measured on {m['host']['cpus']} CPUs, "
                     f"the others on {merged['host']['cpus']}")
        for k, v in m["probes"].items():
            merged["probes"].setdefault(k, []).extend(v)
        for k, lays in m["layouts"].items():
            for lay, v in lays.items():
                merged["layouts"].setdefault(k, {}).setdefault(lay, []).extend(v)
        merged["inject_gbps"] = merged["inject_gbps"] or m["inject_gbps"]
        merged["comms"] = sorted(set(merged["comms"]) | set(m["comms"]))
        merged["models"] += [x for x in m["models"] if x not in merged["models"]]
        merged["complete"] = merged.get("complete") and m.get("complete")
    return merged


def criteria(rows):
    """Issue 36's CPU line for one table: the search's first layout within
    10% of the best measured, predictions within 20% of measured for at
    least 90% of layouts."""
    chosen = rows[0]
    best = min(rows, key=lambda r: r["measured_ms"])
    within = sum(1 for r in rows
                 if abs(r["predicted_ms"] - r["measured_ms"]) <= 0.2 * r["measured_ms"])
    over = chosen["measured_ms"] / best["measured_ms"] - 1
    return {"chosen": chosen["layout"], "chosen_ms": chosen["measured_ms"],
            "best": best["layout"], "best_ms": best["measured_ms"],
            "chosen_over_best": over, "within_20pct": within, "layouts": len(rows),
            "choice_pass": over <= 0.10, "prediction_pass": within >= 0.9 * len(rows)}

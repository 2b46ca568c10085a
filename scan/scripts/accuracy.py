#!/usr/bin/env python3
"""Measures mapp-scan's detection accuracy on mapp-sim jobs with random faults.

usage: accuracy.py BIN_DIR [--trials N]
For each trial: a job shape, a seed, and a scenario (none, slow rank, slow
link, slow rank + slow link) with random culprits and magnitudes. A trial is
correct when the findings name exactly the injected culprits. Prints a table
per scenario and the false-positive count.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

BASE = {
    "microbatches": 8, "steps": 2, "layer_forward_us": 400,
    "backward_factor": 2.0, "embedding_us": 60, "loss_us": 120,
    "optimizer_us": 900, "data_us": 20, "activation_bytes": 4194304,
    "tp_allreduce_bytes": 4194304, "dp_allreduce_bytes": 67108864,
    "network": {"gpus_per_node": 4, "gbps": 100, "latency_us": 5},
    "clock": {"offset_ms": 50, "drift_ppm": 100, "wall_error_ms": 2},
    "jitter": 0.03, "exit_skew_us": 2,
}
SHAPES = [
    dict(tp=2, pp=2, dp=2, layers=8, schedule="1f1b"),
    dict(tp=1, pp=4, dp=2, layers=8, schedule="1f1b"),
    dict(tp=2, pp=4, dp=1, layers=8, schedule="interleaved", chunks=2),
    dict(tp=2, pp=2, dp=4, layers=8, schedule="gpipe"),
]


def p2p_links(shape):
    tp, pp, dp = shape["tp"], shape["pp"], shape["dp"]
    links = []
    for s in range(pp - 1 if shape["schedule"] != "interleaved" else pp):
        for d in range(dp):
            for t in range(tp):
                a = t + tp * (d + dp * s)
                b = t + tp * (d + dp * ((s + 1) % pp))
                links += [(a, b), (b, a)]
    return links


def main():
    bindir = sys.argv[1]
    trials = int(sys.argv[sys.argv.index("--trials") + 1]) if "--trials" in sys.argv else 40
    rng = random.Random(7)
    stats = {}
    fp = 0
    tmp = tempfile.mkdtemp()
    for i in range(trials):
        shape = SHAPES[i % len(SHAPES)]
        scenario = ["none", "rank", "link", "rank+link"][(i // len(SHAPES)) % 4]
        world = shape["tp"] * shape["pp"] * shape["dp"]
        cfg = dict(BASE, **shape, seed=1000 + i)
        faults, expect = [], set()
        if "rank" in scenario:
            r, f = rng.randrange(world), rng.uniform(1.2, 2.0)
            faults.append("slow-compute:rank=%d,factor=%.2f" % (r, f))
            expect.add(("slow-rank", r))
        if "link" in scenario:
            a, b = rng.choice(p2p_links(shape))
            if rng.random() < 0.5:
                faults.append("link-bandwidth:src=%d,dst=%d,gbps=%.0f"
                              % (a, b, rng.uniform(10, 50)))
            else:
                faults.append("link-delay:src=%d,dst=%d,us=%.0f"
                              % (a, b, rng.uniform(200, 600)))
            expect.add(("slow-link", (a, b)))
        cfgp = os.path.join(tmp, "c%d.json" % i)
        json.dump(cfg, open(cfgp, "w"))
        out = os.path.join(tmp, "t%d" % i)
        cmd = [bindir + "/mapp-sim", "--config", cfgp, "-o", out, "-q"]
        for f in faults:
            cmd += ["--inject", f]
        subprocess.run(cmd, check=True)
        rep = os.path.join(tmp, "r%d.json" % i)
        subprocess.run([bindir + "/mapp-scan", out, "-q", "--report", rep],
                       check=True)
        got = set()
        for f in json.load(open(rep))["findings"]:
            got.add((f["kind"], f["rank"]) if f["kind"] == "slow-rank"
                    else (f["kind"], (f["src"], f["dst"])))
        ok = got == expect
        fp += len(got - expect)
        key = scenario
        s = stats.setdefault(key, [0, 0])
        s[0] += ok
        s[1] += 1
        if not ok:
            print("miss: shape %s faults %s expected %s got %s"
                  % (shape, faults, sorted(expect), sorted(got)))
    total = sum(v[0] for v in stats.values()), sum(v[1] for v in stats.values())
    for k, (ok, n) in sorted(stats.items()):
        print("%-10s %d/%d exact" % (k, ok, n))
    print("overall   %d/%d exact, %d false-positive findings" % (total[0], total[1], fp))


main()

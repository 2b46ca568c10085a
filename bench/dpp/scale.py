#!/usr/bin/env python3
"""MegaDPP at scale, predicted by mapp-sim: pipelines of p = 8 ... 64 stages
(one GPT layer per virtual stage, chunks = 2, m = 2p microbatches), static
1F1B / dfc / bfc and adaptive, without faults and with the link 1 -> 0 (the
gradients into the first stage) delayed by US microseconds per message (a
congested or flapping link). GPT h4096 s2048 (one layer's forward ~8 ms at
mapp-sim's default 100 TFLOP/s), links of GBPS Gb/s (400: one InfiniBand
NDR port per stage), 5 us.

usage: bench/dpp/scale.py [--stages 8,16,32,64] [--us 100000] [--gbps 400]
                          [--mem-cap-gib G] [--out DIR]
--mem-cap-gib: the per-rank memory cap adaptive must keep (mapp-sim's
--mem-cap: bfc only where its whole peak fits, else dfc); the table then
says whether every adaptive peak is under it.
Needs mapp-translate, mapp-opt, mapp-sim (build/bin or MAPP_BIN).
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAPP_BIN", ROOT / "build" / "bin"))
NAMES = ("1f1b", "dfc", "bfc", "adaptive")


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{cmd[0]} failed:\n{r.stderr}")
    return r.stdout


def plans(d, p):
    cfg = {"variant": "gpt", "num_layers": 2 * p, "hidden_size": 4096,
           "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 32000,
           "micro_batch_size": 1, "tie_embeddings": True}
    (d / "cfg.json").write_text(json.dumps(cfg))
    run([BIN / "mapp-translate", "--import-gpt-config", d / "cfg.json", "-o", d / "m.mlir"])
    out = {}
    for name, chunks, sched in (("1f1b", 1, "1f1b"), ("adaptive", 2, "adaptive")):
        pipe = (f"--mapp-train-pipeline=tp=1 pp={p} dp=1 chunks={chunks} "
                f"microbatches={2 * p} schedule={sched} optimizer=adamw lr=0.001")
        run([BIN / "mapp-opt", d / "m.mlir", pipe, "-mapp-plan-memory",
             "-mlir-print-op-on-diagnostic=false", "-o", d / f"{name}.mlir"])
        run([BIN / "mapp-translate", "--mapp-to-plan", d / f"{name}.mlir",
             "-o", d / f"{name}.mplan"])
        out[name] = d / f"{name}.mplan"
    return out


def sim(pl, fault, gbps, cap_bytes):
    cmd = [BIN / "mapp-sim", pl["1f1b"], pl["adaptive"], "--compare",
           ",".join(NAMES), "--json", "--gbps", gbps]
    if cap_bytes:
        cmd += ["--mem-cap", cap_bytes]
    if fault:
        cmd += ["--inject", fault]
    return {r["schedule"]: r for r in json.loads(run(cmd))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", default="8,16,32,64")
    ap.add_argument("--us", type=int, default=100000)
    ap.add_argument("--gbps", type=float, default=400)
    ap.add_argument("--mem-cap-gib", type=float, default=0)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench-dpp-scale"))
    a = ap.parse_args()
    if a.mem_cap_gib < 0:
        sys.exit("--mem-cap-gib must be >= 0 (0: no cap)")
    cap = int(a.mem_cap_gib * 2**30)
    fault = f"link-delay:src=1,dst=0,us={a.us}"
    print(f"mapp-sim, GPT h4096 s2048, 2 layers per stage, chunks 2, m = 2p, "
          f"links {a.gbps:g} Gb/s; slow link = {fault}"
          + (f"; adaptive capped at {a.mem_cap_gib:g} GiB per rank" if cap else ""))
    over = 0
    print(f"{'p':>3} {'fault':6} " + " ".join(f"{n + ' ms':>11}" for n in NAMES)
          + f" {'adaptive vs 1f1b':>17} {'vs best static':>15} {'adaptive ran':>13}"
          f" {'peak GiB (1f1b/adaptive)':>25}")
    for p in map(int, a.stages.split(",")):
        d = pathlib.Path(a.out) / f"p{p}"
        d.mkdir(parents=True, exist_ok=True)
        pl = plans(d, p)
        for label, f in (("none", None), ("slow", fault)):
            r = sim(pl, f, a.gbps, cap)
            ms = {n: r[n]["step_us"] / 1000 for n in NAMES}
            best = min(ms[n] for n in NAMES[:3])
            peak = {n: max(r[n]["peak_bytes"]) / 2**30 for n in ("1f1b", "adaptive")}
            print(f"{p:3d} {label:6} " + " ".join(f"{ms[n]:11.2f}" for n in NAMES)
                  + f" {ms['1f1b'] / ms['adaptive']:16.2f}x"
                  f" {100 * (ms['adaptive'] / best - 1):+14.1f}%"
                  f" {r['adaptive']['chosen']:>13}"
                  f" {peak['1f1b']:12.2f} / {peak['adaptive']:.2f}")
            over += cap and r["adaptive"]["peak_stash_bytes"] > cap
    if cap:
        print(f"adaptive peaks above the cap: {over}")


if __name__ == "__main__":
    main()

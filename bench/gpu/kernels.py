#!/usr/bin/env python3
"""Kernels per training step, mapp against torch.compile (issue 37), from
the kernel census (kernel_census.cpp: CUPTI activity records, the same for
both processes).

Usage: kernels.py LONG.tsv SHORT.tsv STEPS [--name N] [--json OUT]
       kernels.py --table ROW.json...

LONG and SHORT are the censuses of two runs that differ only in their step
count (STEPS apart): their difference is STEPS steady steps, warm-up, start-
up and compilation cancelled out. A kernel is a GEMM when its name says so
(cuBLAS/cuBLASLt/CUTLASS: gemm, nvjet, xmma, cutlass), attention when it is
a fused attention kernel (flash, fmha, sdpa, cuDNN's generated attention),
and otherwise non-GEMM: elementwise, norms, softmax, reductions, the
optimizer, copies. Prints one JSON row per run pair; --table prints the
side-by-side table of several rows.
"""
import argparse
import json
import re
import sys

GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|cublas", re.I)
ATTENTION = re.compile(r"flash|fmha|sdpa|attention|attn", re.I)


def census(path):
    rows = {}
    for line in open(path):
        n, ns, name = line.rstrip("\n").split("\t", 2)
        rows[name] = (int(n), int(ns))
    return rows


def kind(name):
    if ATTENTION.search(name):
        return "attention"
    if GEMM.search(name):
        return "gemm"
    return "other"


def steady(long, short, steps):
    per = {}
    for name in set(long) | set(short):
        n = long.get(name, (0, 0))[0] - short.get(name, (0, 0))[0]
        ns = long.get(name, (0, 0))[1] - short.get(name, (0, 0))[1]
        if n:
            per[name] = (n / steps, ns / steps / 1e6)
    return per


def summarize(per, name):
    row = {"name": name, "launches": 0, "ms": 0.0}
    for k in ("gemm", "attention", "other"):
        row[f"{k}_launches"], row[f"{k}_ms"] = 0.0, 0.0
    for kname, (n, ms) in per.items():
        k = kind(kname)
        row[f"{k}_launches"] += n
        row[f"{k}_ms"] += ms
        row["launches"] += n
        row["ms"] += ms
    top = sorted(((ms, n, k) for k, (n, ms) in per.items() if kind(k) == "other"),
                 reverse=True)[:8]
    row["top_other"] = [{"ms": round(ms, 3), "launches": round(n, 1), "kernel": k[:90]}
                        for ms, n, k in top]
    return row


def table(rows):
    out = ["| run | launches / step | GEMM ms | attention ms | non-GEMM ms | non-GEMM launches |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['name']} | {r['launches']:.0f} | {r['gemm_ms']:.2f} | "
                   f"{r['attention_ms']:.2f} | {r['other_ms']:.2f} | {r['other_launches']:.0f} |")
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        print(table([json.loads(open(p).read()) for p in sys.argv[2:]]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("long")
    p.add_argument("short")
    p.add_argument("steps", type=int)
    p.add_argument("--name", default="")
    p.add_argument("--json")
    a = p.parse_args()
    if a.steps <= 0:
        sys.exit("kernels.py: STEPS must be positive")
    row = summarize(steady(census(a.long), census(a.short), a.steps), a.name)
    if a.json:
        json.dump(row, open(a.json, "w"))
    print(json.dumps(row))


if __name__ == "__main__":
    main()

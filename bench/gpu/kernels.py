#!/usr/bin/env python3
"""Kernels per training step, mapp against torch.compile (issue 37), from
the kernel census (kernel_census.cpp: CUPTI activity records, the same for
both processes).

Usage: kernels.py LONG.tsv SHORT.tsv STEPS [--name N] [--ncu CSV] [--json OUT]
       kernels.py --window LONG.tsv SHORT.tsv STEPS
       kernels.py --table ROW.json...
       kernels.py --top ROW.json...

LONG and SHORT are the censuses of two runs that differ only in their step
count (STEPS apart): their difference is STEPS steady steps, warm-up, start-
up and compilation cancelled out. A kernel is a GEMM when its name says so
(cuBLAS/cuBLASLt/CUTLASS: gemm, nvjet, xmma, cutlass), attention when it is
a fused attention kernel (flash, fmha, sdpa, cuDNN's generated attention),
and otherwise non-GEMM: elementwise, norms, softmax, reductions, the
optimizer, copies. Prints one JSON row per run pair; --table prints the
side-by-side table of several rows, --top each row's costliest non-GEMM
kernels.

Bytes moved come from Nsight Compute (--ncu: `ncu --csv --page raw
--print-units base` with dram__bytes_read.sum, dram__bytes_write.sum and
gpu__time_duration.sum) over one steady step: --window prints the launches
to skip (the short run's) and to profile (one step's), so the profiled
window is the step after the short run's last.
"""
import argparse
import csv
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


def window(long, short, steps):
    """Launches to skip (the short run's) and one steady step's launches."""
    skip = sum(n for n, _ in short.values())
    per = (sum(n for n, _ in long.values()) - skip) / steps
    if per <= 0:
        sys.exit(f"kernels.py: {per} launches per step: the long run launched no more")
    if per != int(per):
        print(f"kernels.py: {per:.2f} launches per step (steps differ): profiling "
              f"{round(per)}", file=sys.stderr)
    return skip, round(per)


def ncu_rows(path):
    """(kernel, bytes read + written, ns) per profiled launch of an ncu CSV."""
    lines = [l for l in open(path) if l.startswith('"')]  # drops ncu's ==PROF== lines
    rows = []
    for r in csv.DictReader(lines):
        if not r.get("ID", "").isdigit():  # the units row
            continue
        try:
            b = float(r["dram__bytes_read.sum"]) + float(r["dram__bytes_write.sum"])
            ns = float(r["gpu__time_duration.sum"])
        except (KeyError, ValueError) as e:
            sys.exit(f"kernels.py: {path}: no DRAM bytes or duration in row {r.get('ID')}: {e}")
        rows.append((r["Kernel Name"], b, ns))
    if not rows:
        sys.exit(f"kernels.py: {path}: no profiled kernels")
    return rows


def summarize(per, name, ncu=None):
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
    if ncu:
        # One step under ncu: bytes per class, and per kernel name the bytes
        # and the bandwidth it reached (DRAM bytes over its duration).
        by = {}
        for kname, b, ns in ncu:
            k = kind(kname)
            row[f"{k}_gb"] = row.get(f"{k}_gb", 0.0) + b / 1e9
            t = by.setdefault(kname, [0, 0.0, 0.0])
            t[0] += 1
            t[1] += b
            t[2] += ns
        row["ncu_launches"] = len(ncu)
        top = sorted(((b, n, ns, k) for k, (n, b, ns) in by.items() if kind(k) == "other"),
                     reverse=True)[:8]
        row["top_other_bytes"] = [{"gb": round(b / 1e9, 3), "launches": n,
                                   "tb_s": round(b / ns / 1e3, 2) if ns else 0.0,
                                   "kernel": k[:90]} for b, n, ns, k in top]
    return row


def table(rows):
    out = ["| run | launches / step | GEMM ms | attention ms | non-GEMM ms | non-GEMM launches "
           "| non-GEMM GB | GEMM + attention GB |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        gb = (f"{r['other_gb']:.2f} | {r.get('gemm_gb', 0) + r.get('attention_gb', 0):.2f}"
              if "other_gb" in r else "- | -")
        out.append(f"| {r['name']} | {r['launches']:.0f} | {r['gemm_ms']:.2f} | "
                   f"{r['attention_ms']:.2f} | {r['other_ms']:.2f} | {r['other_launches']:.0f} | {gb} |")
    return "\n".join(out)


def top(rows):
    out = []
    for r in rows:
        out.append(f"{r['name']} top non-GEMM by time: " + "; ".join(
            f"{k['kernel'][:50]} {k['ms']:.2f} ms x{k['launches']:.0f}" for k in r["top_other"][:5]))
        if "top_other_bytes" in r:
            out.append(f"{r['name']} top non-GEMM by bytes: " + "; ".join(
                f"{k['kernel'][:50]} {k['gb']:.2f} GB x{k['launches']} at {k['tb_s']:.2f} TB/s"
                for k in r["top_other_bytes"][:5]))
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("--table", "--top"):
        rows = [json.loads(open(p).read()) for p in sys.argv[2:]]
        print(table(rows) if sys.argv[1] == "--table" else top(rows))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--window":
        print(*window(census(sys.argv[2]), census(sys.argv[3]), int(sys.argv[4])))
        return
    p = argparse.ArgumentParser()
    p.add_argument("long")
    p.add_argument("short")
    p.add_argument("steps", type=int)
    p.add_argument("--name", default="")
    p.add_argument("--ncu", help="ncu CSV of one steady step: bytes moved")
    p.add_argument("--json")
    a = p.parse_args()
    if a.steps <= 0:
        sys.exit("kernels.py: STEPS must be positive")
    row = summarize(steady(census(a.long), census(a.short), a.steps), a.name,
                    ncu_rows(a.ncu) if a.ncu else None)
    if a.json:
        json.dump(row, open(a.json, "w"))
    print(json.dumps(row))


if __name__ == "__main__":
    main()

"""bf16 against fp8 (bench/gpu/fp8.sh): tokens/s side by side and both loss
curves (step, bf16, fp8, diff), from mapp-run's metrics files.

  fp8_curves.py OUT.tsv NAME BF16.jsonl FP8.jsonl [NAME BF16 FP8 ...]

tokens/s is the median over steps after the first three (warm-up: cuBLASLt
heuristics and algorithm timing, allocations). The curve of the first pair
is printed in full (every 10th step) and written to OUT.tsv; the summary
line per pair is printed last.
"""
import json
import statistics
import sys


def load(p):
    try:
        return [json.loads(l) for l in open(p) if l.strip()]
    except OSError:
        return []


def tps(rows):
    xs = [r["tokens_per_s"] for r in rows[3:]] or [r["tokens_per_s"] for r in rows]
    return statistics.median(xs) if xs else float("nan")


out = sys.argv[1]
args = sys.argv[2:]
summary = []
for i in range(0, len(args), 3):
    name, a, b = args[i:i + 3]
    ra, rb = load(a), load(b)
    if not ra or not rb:
        summary.append(f"{name}: missing metrics (bf16 {len(ra)} rows, fp8 {len(rb)} rows)")
        continue
    n = min(len(ra), len(rb))
    diffs = [rb[j]["loss"] - ra[j]["loss"] for j in range(n)]
    if i == 0:
        with open(out, "w") as f:
            f.write("step\tbf16\tfp8\tdiff\n")
            for j in range(n):
                f.write(f"{ra[j]['step']}\t{ra[j]['loss']:.6f}\t{rb[j]['loss']:.6f}\t{diffs[j]:+.6f}\n")
        print(f"{name} loss curves (every 10th step; all {n} in {out}):")
        print(f"{'step':>5} {'bf16':>9} {'fp8':>9} {'diff':>9}")
        for j in list(range(0, n, 10)) + ([n - 1] if (n - 1) % 10 else []):
            print(f"{ra[j]['step']:5d} {ra[j]['loss']:9.4f} {rb[j]['loss']:9.4f} {diffs[j]:+9.4f}")
    ta, tb = tps(ra), tps(rb)
    tail = max(1, n // 10)
    last_a = statistics.mean(r["loss"] for r in ra[n - tail:n])
    last_b = statistics.mean(r["loss"] for r in rb[n - tail:n])
    finite = all(r["loss"] == r["loss"] for r in rb[:n])
    summary.append(
        f"{name}: bf16 {ta / 1e3:7.1f}k tok/s, fp8 {tb / 1e3:7.1f}k tok/s ({tb / ta:.3f}x); "
        f"{n} steps, mean loss of the last {tail}: bf16 {last_a:.4f} fp8 {last_b:.4f} "
        f"(diff {last_b - last_a:+.4f}), max |diff| {max(abs(d) for d in diffs):.4f}"
        + ("" if finite else ", fp8 loss NOT FINITE"))
print("\n".join(summary))

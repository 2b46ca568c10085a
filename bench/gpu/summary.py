"""Side-by-side table of bench/gpu.sh: mapp (cuda) vs torch eager/compile.

ms/step is the median over steps after the first three (warm-up: cuBLASLt
heuristics, allocations); FLOPs per step 6·N·tokens + 6·L·s·h·tokens with N
the parameter count (shared/DEVICE.md), MFU against 806 TFLOP/s.
"""
import json
import os
import statistics
import sys

log, cfgdir = sys.argv[1], sys.argv[2]
rows = []
for c in ("gpt-124m", "gpt-1.3b"):
    cfg = json.load(open(os.path.join(cfgdir, c + ".json")))
    L, h, s, V = cfg["num_layers"], cfg["hidden_size"], cfg["seq_length"], cfg["vocab_size"]
    B = cfg["micro_batch_size"]
    N = V * h + s * h + L * (12 * h * h + 13 * h) + 2 * h
    tokens = B * s
    flops = 6 * N * tokens + 6 * L * s * h * tokens
    res, peak = {}, {}
    p = os.path.join(log, c + ".bench.jsonl")
    if os.path.exists(p):
        m = [json.loads(l) for l in open(p)]
        ms = [x["step_ms"] for x in m[3:]] or [x["step_ms"] for x in m]
        if ms:
            res["mapp-cuda"] = statistics.median(ms)
        runlog = os.path.join(log, c + ".run.log")
        if os.path.exists(runlog):
            for line in open(runlog):
                if line.startswith("mapp-run: peak device memory"):
                    peak["mapp-cuda"] = float(line.split()[4])
    for mode in ("eager", "compile"):
        p = os.path.join(log, f"{c}.torch-{mode}.json")
        try:
            r = json.loads(open(p).read().strip().splitlines()[-1])
            res[f"torch-{mode}"] = r["ms_per_step"]
            peak[f"torch-{mode}"] = r.get("peak_gib")
        except Exception:
            pass
    for impl, ms in res.items():
        ratio = ""
        if impl == "mapp-cuda":
            ratio = " ".join(f"{k}/mapp={v / ms:.2f}x" for k, v in res.items() if k != impl)
        rows.append(f"{c:9s} {impl:14s} {ms:9.1f} ms/step {tokens / ms * 1e3 / 1e3:8.1f}k tok/s "
                    f"MFU {flops / (ms * 1e-3) / 806e12 * 100:5.1f}%  peak "
                    + (f"{peak[impl]:5.1f} GiB " if peak.get(impl) else "   ?      ")
                    + ratio)
print("\n".join(rows) if rows else "no benchmark results")

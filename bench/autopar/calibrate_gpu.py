#!/usr/bin/env python3
"""mapp-run --calibrate --backend cuda, checked against PyTorch on the same GPU.

    python3 bench/autopar/calibrate_gpu.py [--mapp-run build/bin/mapp-run]
        [-o /tmp/mapp-calibrate-cuda.json] [--comm local|mpi]

Runs the calibration (its table on stderr), then checks the profile: the
device kind matches torch.cuda.get_device_name(), every rate is positive and
finite, and each GEMM class's rate is within 0.2x..5x of torch.matmul on the
same shape (bf16 for the bf16 and f32 rows: the CUDA backend computes fp32
operands in bf16; fp8 rows are printed, not compared). Prints one line per
check and exits 1 if any fails (docs/auto-parallel.md, "Calibration")."""

import argparse
import json
import math
import os
import subprocess
import sys
import time


def torch_tflops(m, n, k, dtype):
    import torch
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    torch.matmul(a, b)
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(10):
        t = time.perf_counter()
        for _ in range(5):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / 5)
    return 2.0 * m * n * k / best / 1e12


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--mapp-run", default=os.path.join(root, "build", "bin", "mapp-run"))
    ap.add_argument("-o", default="/tmp/mapp-calibrate-cuda.json")
    ap.add_argument("--comm", default="local")
    args = ap.parse_args()
    t0 = time.monotonic()
    r = subprocess.run([args.mapp_run, "--calibrate", "--backend", "cuda",
                        "--comm", args.comm, "-o", args.o])
    wall = time.monotonic() - t0
    if r.returncode != 0:
        print(f"FAIL mapp-run --calibrate exited {r.returncode}")
        return 1
    p = json.load(open(args.o))
    import torch
    failed = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failed.append(what)

    name = torch.cuda.get_device_name()
    check(p["device"] in name.lower(), f"device {p['device']} for '{name}'")
    check(wall < 60, f"wall {wall:.1f} s (< 60)")
    rates = {"gemm_tflops." + k: v for k, v in p["gemm_tflops"].items()}
    rates.update(mem_gbps=p["mem_gbps"], op_overhead_us=p["op_overhead_us"],
                 attention_efficiency=p["attention_efficiency"],
                 memory_gib=p["memory_gib"])
    for k, v in rates.items():
        check(math.isfinite(v) and v > 0, f"{k} = {v:.4g}")
    for link, l in p["links"].items():
        check(l["gbps"] > 0 and l["latency_us"] > 0,
              f"links.{link}: {l['gbps']:.1f} Gb/s, {l['latency_us']:.2f} us")
    for g in p["measured"]["gemm"]:
        line = f"gemm {g['class']:6} {g['dtype']:4} {g['m']}x{g['n']}x{g['k']}: mapp {g['tflops']:.1f} TFLOP/s"
        if g["dtype"] == "fp8":
            print("     " + line)
            continue
        t = torch_tflops(g["m"], g["n"], g["k"], torch.bfloat16)
        check(0.2 < g["tflops"] / t < 5, f"{line}, torch bf16 {t:.1f} (x{g['tflops'] / t:.2f})")
    print(json.dumps(p["measured"].get("notes", [])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

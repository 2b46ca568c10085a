#!/usr/bin/env python3
"""Predicted gains of re-partitioning pipeline stages away from a slow rank
(issue 39), at 1,024 ranks, by mapp-sim.

For each slow factor F of one rank of pipeline stage S:
  1. the decision: the compiler's weighted partition of an L-layer GPT,
     `mapp-opt -mapp-pipeline-partition="pp=P stage-weights=1,..,F,..,1"`
     (its wall time is the decision's cost; the layers come from its remark);
  2. the prediction: mapp-sim of the tp x pp x dp job with the even split and
     with that partition (`stage_layers`), both under
     `slow-compute:rank=R,factor=F`, and the fault-free even job.
Prints a markdown table (docs/benchmarks.md).

    python3 bench/elastic/repartition_gains.py [--bin build/bin]
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
TP, PP, DP, LAYERS, SLOW_STAGE = 8, 8, 16, 32, 3


def sim_step_ms(sim, cfg, d):
    path = d / "job.json"
    path.write_text(json.dumps(cfg))
    out = subprocess.run([sim, "--config", path], capture_output=True,
                         text=True, check=True).stdout
    return float(re.search(r"mean step ([0-9.]+) ms", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build" / "bin"))
    a = ap.parse_args()
    opt, sim = f"{a.bin}/mapp-opt", f"{a.bin}/mapp-sim"
    d = pathlib.Path(tempfile.mkdtemp(prefix="repartition-"))
    model = d / "gpt.mlir"
    model.write_text(subprocess.run(
        [sys.executable, REPO / "test/Transforms/Parallel/Inputs/gen_gpt.py",
         str(LAYERS)], capture_output=True, text=True, check=True).stdout)
    slow_rank = TP * (0 + DP * SLOW_STAGE)  # tp 0, dp 0 of the slow stage
    base = {"tp": TP, "pp": PP, "dp": DP, "microbatches": 16, "steps": 2,
            "layers": LAYERS, "layer_forward_us": 400, "backward_factor": 2.0,
            "activation_bytes": 4194304, "tp_allreduce_bytes": 4194304,
            "dp_allreduce_bytes": 67108864, "jitter": 0.0, "seed": 1,
            "network": {"gpus_per_node": 8}}
    clean = sim_step_ms(sim, base, d)
    print(f"{TP * PP * DP} ranks (tp {TP}, pp {PP}, dp {DP}), {LAYERS} layers, "
          f"rank {slow_rank} (stage {SLOW_STAGE}) slow; fault-free step "
          f"{clean:.1f} ms\n")
    print("| slow factor | partition (layers per stage) | decision | even, slow | "
          "re-partitioned, slow | predicted gain |")
    print("| --- | --- | --- | --- | --- | --- |")
    for f in (1.2, 1.5, 2.0):
        weights = ",".join(str(f if s == SLOW_STAGE else 1) for s in range(PP))
        t0 = time.perf_counter()
        r = subprocess.run([opt, model, "-mlir-print-op-on-diagnostic=false",
                            f"-mapp-pipeline-partition=pp={PP} stage-weights={weights}",
                            "-o", "/dev/null"], capture_output=True, text=True,
                           check=True)
        decision = time.perf_counter() - t0
        spans = re.findall(r"layers (\d+)-(\d+)", r.stderr)
        layers = [int(b) - int(a) + 1 for a, b in spans]
        fault = [f"slow-compute:rank={slow_rank},factor={f}"]
        even = sim_step_ms(sim, dict(base, faults=fault), d)
        moved = sim_step_ms(sim, dict(base, faults=fault, stage_layers=layers), d)
        print(f"| {f}x | {','.join(map(str, layers))} | {decision:.2f} s | "
              f"{even:.1f} ms | {moved:.1f} ms | {even / moved:.2f}x |")


if __name__ == "__main__":
    main()

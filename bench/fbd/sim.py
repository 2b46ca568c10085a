#!/usr/bin/env python3
"""MegaFBD at scale, predicted by mapp-sim: a GPT-1.3B-like model (h 2048,
24 layers, 16 heads, s 2048, vocab 50304, micro-batch 1, m = 2p) at tp = 8,
pp in {4, 8}, dp 1, on nodes of 8 GPUs (NVLink 1800 Gb/s inside a node,
GBPS Gb/s between nodes; the forward ranks come after the backward ones in
rank order, so they sit on their own nodes). Per pp: the unsplit plan
against split ones — fwd-tp 1 or 8, recompute or activations, the forward
side on the same devices or on devices SPEED times as fast (--device-speed
fwd=SPEED) — step time, each side's peak memory per rank and the step-end
parameter copy. The copy goes through the coordinator, as mapp-run's
default.

usage: bench/fbd/sim.py [--stages 4,8] [--gbps 400] [--speed 0.3] [--out DIR]
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
CFG = {"variant": "gpt", "num_layers": 24, "hidden_size": 2048,
       "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 50304,
       "micro_batch_size": 1, "tie_embeddings": True}


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{cmd[0]} failed:\n{r.stderr}")
    return r.stdout


def plan(d, name, pp, extra):
    pipe = (f"--mapp-train-pipeline=tp=8 pp={pp} dp=1 microbatches={2 * pp} "
            f"schedule=1f1b optimizer=adamw lr=0.001 {extra}")
    run([BIN / "mapp-opt", d / "m.mlir", pipe, "-mapp-plan-memory",
         "-mlir-print-op-on-diagnostic=false", "-o", d / f"{name}.mlir"])
    run([BIN / "mapp-translate", "--mapp-to-plan", d / f"{name}.mlir",
         "-o", d / f"{name}.mplan"])
    return d / f"{name}.mplan"


def sim(p, gbps, *extra):
    out = run([BIN / "mapp-sim", p, "--json", "--gpus-per-node", 8,
               "--gbps", gbps, *extra])
    return json.loads(out)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", default="4,8")
    ap.add_argument("--gbps", type=float, default=400)
    ap.add_argument("--speed", type=float, default=0.3)
    ap.add_argument("--out", default=str(ROOT / "out" / "bench-fbd-sim"))
    a = ap.parse_args()
    fbd = "fbd=true fwd-device=cuda bwd-device=cuda"
    layouts = [  # label, pipeline options, mapp-sim options
        ("unsplit tp=8", "", []),
        ("fbd f1/b8 recompute", f"{fbd} fwd-tp=1 transfer=recompute", []),
        (f"  fwd at {a.speed:g}x speed", None, ["--device-speed", f"fwd={a.speed:g}"]),
        ("fbd f1/b8 activations", f"{fbd} fwd-tp=1 transfer=activations", []),
        (f"  fwd at {a.speed:g}x speed", None, ["--device-speed", f"fwd={a.speed:g}"]),
        ("fbd f8/b8 recompute", f"{fbd} fwd-tp=8 transfer=recompute", []),
        ("fbd f8/b8 activations", f"{fbd} fwd-tp=8 transfer=activations", []),
        (f"  fwd at {a.speed:g}x speed", None, ["--device-speed", f"fwd={a.speed:g}"]),
    ]
    print(f"mapp-sim, GPT h2048 L24 s2048 (1.3B-like), tp 8, m = 2p, 8 GPUs/node, "
          f"links {a.gbps:g} Gb/s between nodes, 100 TFLOP/s per GPU")
    print(f"{'pp':>2} {'layout':26} {'ranks':>5} {'step ms':>9} {'vs unsplit':>10} "
          f"{'peak GiB bwd':>12} {'peak GiB fwd':>12} {'copy GB/step':>12}")
    for pp in map(int, a.stages.split(",")):
        d = pathlib.Path(a.out) / f"pp{pp}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cfg.json").write_text(json.dumps(CFG))
        run([BIN / "mapp-translate", "--import-gpt-config", d / "cfg.json", "-o", d / "m.mlir"])
        base = None
        last = None
        for i, (label, opts, flags) in enumerate(layouts):
            if opts is not None:
                last = plan(d, f"l{i}", pp, opts)
            r = sim(last, a.gbps, *flags)
            ms = r["step_us"] / 1000
            base = base or ms
            roles = r.get("roles", [])
            bwd = r.get("peak_bytes_bwd", max(r["peak_bytes"])) / 2**30
            fwd = r.get("peak_bytes_fwd", 0) / 2**30
            copy = r.get("param_copy_bytes", 0) / 1e9
            print(f"{pp:2d} {label:26} {len(r['peak_bytes']):5d} {ms:9.2f} "
                  f"{ms / base:9.2f}x {bwd:12.2f} "
                  f"{(f'{fwd:.2f}' if roles else '-'):>12} {copy:12.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares two parameter sets that live on different machines (issue 37's
step-64 bisect): each side reduces its update (params - init) per tensor to a
CountSketch of K buckets (a fixed multiplicative hash of the element index
picks the bucket and the sign), which is linear and keeps norms and
differences in expectation (||S(a) - S(b)|| ~ ||a - b||), so only the
sketches travel.

  param_sketch.py sketch PARAMS INIT OUT.pt [--keep NAME,...]
      sketches of PARAMS - INIT (and of INIT, to check both sides start
      alike); --keep also stores those tensors whole
  param_sketch.py compare A.pt B.pt
      per tensor: |S(dA) - S(dB)| / |S(dB)| and |dA| / |dB|, worst first
"""
import sys

import torch

K = 4096


def sketch(delta):
    d = delta.reshape(-1).double()
    idx = torch.arange(d.numel(), dtype=torch.int64)
    h = (idx * 2654435761 + 97) % (1 << 32)
    sign = ((h >> 16) & 1).double() * 2 - 1
    return torch.zeros(K, dtype=torch.float64).index_add_(0, h % K, sign * d)


def main():
    from mapp import safetensors
    if sys.argv[1] == "sketch":
        params = safetensors.load(sys.argv[2])[0]
        init = safetensors.load(sys.argv[3])[0]
        keep = set(sys.argv[6].split(",")) if "--keep" in sys.argv else set()
        out = {"sketch": {}, "norm": {}, "whole": {}, "init": {}}
        for name, t in params.items():
            delta = t.double() - init[name].double()
            out["sketch"][name] = sketch(delta)
            out["norm"][name] = float(delta.norm())
            out["init"][name] = sketch(init[name])
            if name in keep:
                out["whole"][name] = t.float().clone()
        torch.save(out, sys.argv[4])
        return
    a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
    # The two sides must start from the same initial parameters.
    worst = max(float((a["init"][n] - b["init"][n]).norm() / b["init"][n].norm().clamp_min(1e-30))
                for n in b["init"])
    print(f"initial parameters: worst relative sketch difference {worst:.3e}")
    rows = []
    for name, sb in b["sketch"].items():
        sa = a["sketch"][name]
        rel = float((sa - sb).norm() / sb.norm().clamp_min(1e-30))
        rows.append((rel, name, a["norm"][name] / max(b["norm"][name], 1e-30)))
    for rel, name, ratio in sorted(rows, reverse=True):
        print(f"{rel:.3e}  |dA|/|dB| {ratio:.4f}  {name}")


if __name__ == "__main__":
    main()

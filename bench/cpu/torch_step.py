"""PyTorch side of bench/cpu/compare.sh: the same model (mapp.reference.GPT,
the numerical oracle of the test suite) trained with torch.optim.AdamW on
random byte-vocabulary batches; prints one JSON object with per-step
milliseconds. Run with Debian's /usr/bin/python3 (torch 1.13).

  torch_step.py CONFIG.json --threads K --steps N [--lr LR]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "python"))
from mapp.reference import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-4)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        cfg = json.load(f)
    model = GPT(cfg, seed=0)
    model.train()
    # mapp's default optimizer: AdamW (torch defaults for betas/eps, wd 0.01).
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, foreach=False)
    mbs, seq, vocab = cfg["micro_batch_size"], cfg["seq_length"], cfg["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    times = []
    losses = []
    for _ in range(a.steps):
        tokens = torch.randint(0, vocab, (mbs, seq), generator=gen)
        targets = torch.randint(0, vocab, (mbs, seq), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
        losses.append(float(loss))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "step_ms": times, "loss": losses}))


if __name__ == "__main__":
    main()

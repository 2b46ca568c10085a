"""The training-step timer shared by the PyTorch baselines of bench/gpu
(torch_gpt.py, torch_llama.py, torch_moe.py): one fixed random batch, bf16
autocast, fused AdamW, eager or torch.compile, median step time after
warm-up, peak memory; optionally the top CUDA kernels of two profiled steps
(torch.profiler) on stderr, to set beside MAPP_CUDA_PROFILE's table.
"""
import argparse
import json
import statistics
import sys
import time

import torch


def arguments(extra=None):
    p = argparse.ArgumentParser()
    p.add_argument("cfg")
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=0)
    if extra:
        extra(p)
    a = p.parse_args()
    return a, json.load(open(a.cfg))


def profile(step, top):
    from torch.profiler import ProfilerActivity, profile as prof
    steps = 2
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = sorted(((e.device_time_total, e.count, e.key) for e in p.key_averages()),
                  reverse=True)
    total = sum(r[0] for r in rows) / 1e3 / steps
    print(f"torch profile: {total:.2f} ms/step of CUDA kernels", file=sys.stderr)
    for t, n, k in rows[:top]:
        print(f"  {t / 1e3 / steps:9.3f} ms/step {n // steps:5d}/step  {k[:110]}",
              file=sys.stderr)


def time_training(model, c, a):
    """model(tok, tgt) -> loss, on the GPU. Returns the JSON row (a dict)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    B, T, V = c["micro_batch_size"], c["seq_length"], c["vocab_size"]
    tok = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    if a.profile:
        profile(step, a.profile)
    return {"impl": f"torch-{a.mode}", "ms_per_step": ms,
            "tokens_per_s": B * T / ms * 1e3, "peak_gib": peak, "loss": loss.item()}

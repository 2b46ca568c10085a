"""PyTorch baseline for bench/gpu.sh: the same GPT (pre-norm GPT-2 blocks,
tanh GELU, tied embeddings, learned positions) written for speed as the
DEVICE.md baseline was measured: bf16 autocast, SDPA (flash) attention, fused
AdamW; eager or torch.compile.

Usage: torch_gpt.py CFG.json --mode eager|compile --steps N --warmup W
Prints one JSON line: ms_per_step (median), tokens_per_s, peak_gib.
With --profile K: also the K kernels taking the most CUDA time per step over
two profiled steps (torch.profiler), on stderr, to set beside
MAPP_CUDA_PROFILE's table.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x):
        B, T, H = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(H, dim=2)
        q, k, v = (t.view(B, T, self.heads, H // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(B, T, H))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.wte = nn.Embedding(c["vocab_size"], h)
        self.wpe = nn.Embedding(c["seq_length"], h)
        self.blocks = nn.ModuleList(Block(h, c["num_attention_heads"])
                                    for _ in range(c["num_layers"]))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, tok, tgt):
        x = self.wte(tok) + self.wpe.weight[: tok.shape[1]]
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


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
    import sys
    print(f"torch profile: {total:.2f} ms/step of CUDA kernels", file=sys.stderr)
    for t, n, k in rows[:top]:
        print(f"  {t / 1e3 / steps:9.3f} ms/step {n // steps:5d}/step  {k[:110]}",
              file=sys.stderr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cfg")
    p.add_argument("--mode", default="eager")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", type=int, default=0)
    a = p.parse_args()
    c = json.load(open(a.cfg))
    torch.manual_seed(0)
    model = GPT(c).cuda()
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

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    if a.profile:
        profile(step, a.profile)
    print(json.dumps({"impl": f"torch-{a.mode}", "ms_per_step": ms,
                      "tokens_per_s": B * T / ms * 1e3,
                      "peak_gib": torch.cuda.max_memory_allocated() / 2**30}))


if __name__ == "__main__":
    main()

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
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_train import arguments, time_training


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


def main():
    a, c = arguments()
    torch.manual_seed(0)
    print(json.dumps(time_training(GPT(c).cuda(), c, a)))


if __name__ == "__main__":
    main()

"""PyTorch baseline of the LLaMA-style benchmark model (bench/gpu/llama.sh),
written for speed independently of mapp: RMSNorm, rotary embeddings
(rotate-half, fp32 angles), grouped-query attention through SDPA with
enable_gqa (no repeated K/V), SwiGLU MLP, no biases, tied embeddings; bf16
autocast, fused AdamW; eager or torch.compile.

Usage: torch_llama.py CFG.json --mode eager|compile --steps N --warmup W [--profile K]
Prints one JSON line: ms_per_step (median), tokens_per_s, peak_gib.
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_train import arguments, time_training


def rope_tables(T, D, base, device):
    inv = 1.0 / (base ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.kv = c.get("num_query_groups", self.heads)
        self.d = h // self.heads
        self.norm1 = nn.RMSNorm(h, eps=c.get("norm_epsilon", 1e-5))
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, self.kv * self.d, bias=False)
        self.v = nn.Linear(h, self.kv * self.d, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.norm2 = nn.RMSNorm(h, eps=c.get("norm_epsilon", 1e-5))
        f = c["ffn_hidden_size"]
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, H = x.shape
        y = self.norm1(x)
        q = self.q(y).view(B, T, self.heads, self.d).transpose(1, 2)
        k = self.k(y).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.v(y).view(B, T, self.kv, self.d).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv != self.heads)
        x = x + self.o(o.transpose(1, 2).reshape(B, T, H))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["num_layers"]))
        self.norm = nn.RMSNorm(c["hidden_size"], eps=c.get("norm_epsilon", 1e-5))
        self.head = None if c.get("tie_embeddings", True) else \
            nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, tok, tgt):
        T = tok.shape[1]
        d = self.c["hidden_size"] // self.c["num_attention_heads"]
        cos, sin = rope_tables(T, d, self.c.get("rotary_base", 10000.0), tok.device)
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x, cos, sin)
        x = self.norm(x)
        logits = x @ self.emb.weight.t() if self.head is None else self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def main():
    a, c = arguments()
    torch.manual_seed(0)
    print(json.dumps(time_training(Llama(c).cuda(), c, a)))


if __name__ == "__main__":
    main()

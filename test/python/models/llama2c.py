"""llama2.c / lit-style: one fused wqkv split([H, H, H]), cos/sin tables
precomputed as non-persistent buffers and sliced, RMSNorm written as
x * rsqrt(mean(x * x) + eps) * w inline in a function, SwiGLU from one
w12 projection chunked in two, tied embeddings, returns (logits, loss)
(picked with --output 1)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * weight


def build_rope_cache(seq_len, n_elem, base=10000):
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2).float() / n_elem))
    seq_idx = torch.arange(seq_len).float()
    idx_theta = torch.outer(seq_idx, theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def apply_rope(x, cos, sin):
    head_size = x.size(-1)
    x1 = x[..., : head_size // 2]
    x2 = x[..., head_size // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        e, self.nh = c["n_embd"], c["n_head"]
        self.attn_norm = nn.Parameter(torch.ones(e))
        self.wqkv = nn.Linear(e, 3 * e, bias=False)
        self.proj = nn.Linear(e, e, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(e))
        self.w12 = nn.Linear(e, 2 * c["intermediate_size"], bias=False)
        self.w3 = nn.Linear(c["intermediate_size"], e, bias=False)
        self.eps = c["eps"]

    def forward(self, x, cos, sin):
        B, T, E = x.shape
        hs = E // self.nh
        q, k, v = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).split([E, E, E], dim=-1)
        q = q.reshape(B, T, self.nh, hs).permute(0, 2, 1, 3)
        k = k.reshape(B, T, self.nh, hs).permute(0, 2, 1, 3)
        v = v.reshape(B, T, self.nh, hs).permute(0, 2, 1, 3)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(B, T, E)
        x = x + self.proj(y)
        gate, up = self.w12(rms_norm(x, self.mlp_norm, self.eps)).chunk(2, dim=-1)
        return x + self.w3(F.silu(gate) * up)


class LlamaLite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.final_norm = nn.Parameter(torch.ones(c["n_embd"]))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)
        self.eps = c["eps"]
        cos, sin = build_rope_cache(c["block_size"], c["n_embd"] // c["n_head"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.tok(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.lm_head(rms_norm(x, self.final_norm, self.eps))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

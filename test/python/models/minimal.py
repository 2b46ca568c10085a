"""A compact from-scratch GPT: one qkv Linear viewed as [B,T,3,nh,D] and
permuted (2,0,3,1,4), q/k/v selected by index, bool tril buffer applied with
torch.where(mask, s, -inf), divide by sqrt(D), nn.Sequential MLP with
nn.GELU(approximate="tanh"), learned absolute positions as a Parameter,
pre-norm stack with biased LayerNorm, returns the loss only.  causal=False
drops the mask and adds a learned temperature (not the exact attention
pattern: the primitive-op fallback)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len, causal=True):
        super().__init__()
        self.h, self.is_causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len)).bool())
        if not causal:
            self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)
        if self.is_causal:
            s = torch.where(self.causal[:T, :T], s, float("-inf"))
        else:
            s = s * self.temperature
        y = s.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Layer(nn.Module):
    def __init__(self, d_model, n_heads, max_len, causal):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.sa = SelfAttention(d_model, n_heads, max_len, causal)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(approximate="tanh"),
                                nn.Linear(2 * d_model, d_model), nn.Dropout(p=0.0))

    def forward(self, x):
        x = x + self.sa(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.embed = nn.Embedding(cfg["vocab_size"], d)
        self.pos = nn.Parameter(torch.randn(1, cfg["seq_length"], d) * 0.02)
        self.blocks = nn.ModuleList([Layer(d, cfg["heads"], cfg["seq_length"], cfg.get("causal", True))
                                     for _ in range(cfg["depth"])])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg["vocab_size"])

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.pos[:, :tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="mean")

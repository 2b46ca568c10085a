"""Issue 38, written from its description: an OLMo-like model. LayerNorm
without parameters written out as (x − mean) / sqrt(var + eps); q and k
normalized per head the same way (qk-norm) with a learned scale; a
squared-ReLU MLP (relu(x)²); an additive mask built with
torch.where(tril, 0, -inf); clamp of the pre-activation (clip_qkv)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def plain_norm(x, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / torch.sqrt(var + eps)


class OlmoBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.nh, self.hd = c["n_heads"], d // c["n_heads"]
        self.att_proj = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.q_scale = nn.Parameter(torch.ones(self.hd))
        self.k_scale = nn.Parameter(torch.ones(self.hd))
        self.ff_proj = nn.Linear(d, c["mlp_hidden"], bias=False)
        self.ff_out = nn.Linear(c["mlp_hidden"], d, bias=False)
        self.clip = c["clip_qkv"]

    def forward(self, x, bias):
        b, t, d = x.shape
        qkv = self.att_proj(plain_norm(x)).clamp(min=-self.clip, max=self.clip)
        q, k, v = qkv.split(d, dim=-1)
        q = plain_norm(q.view(b, t, self.nh, self.hd)) * self.q_scale
        k = plain_norm(k.view(b, t, self.nh, self.hd)) * self.k_scale
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, t, self.nh, self.hd).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.hd) + bias, dim=-1)
        x = x + self.attn_out((w @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff_out(F.relu(self.ff_proj(plain_norm(x))) ** 2)


class Olmo(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["d_model"])
        self.wpe = nn.Parameter(torch.randn(c["seq_length"], c["d_model"]) * 0.02)
        self.blocks = nn.ModuleList(OlmoBlock(c) for _ in range(c["n_layers"]))
        self.ff = nn.Linear(c["d_model"], c["vocab_size"], bias=False)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
        bias = torch.where(keep, torch.tensor(0.0), torch.tensor(float("-inf")))
        x = self.wte(tokens) + self.wpe[:t]
        for blk in self.blocks:
            x = blk(x, bias)
        logits = self.ff(plain_norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

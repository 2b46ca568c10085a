"""Issue 38, written from its description (not copied): a LLaMA training
script's model in Meta's real-valued style. Rotary on interleaved pairs
with cos/sin tables kept as buffers: x.float().reshape(..., -1, 2).unbind(-1),
products with the tables, torch.stack(...).flatten(3); RMSNorm by hand;
grouped-query attention by repeat_kv; SwiGLU; tied embeddings."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_tables(head_dim, length, theta):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    ang = torch.outer(torch.arange(length).float(), inv)  # [T, D/2]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x [B, T, heads, D]; cos, sin [T, D/2]
    xr, xi = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    out_r = xr * cos - xi * sin
    out_i = xr * sin + xi * cos
    return torch.stack([out_r, out_i], dim=-1).flatten(3).type_as(x)


class Norm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        ms = x.float().pow(2).mean(dim=-1, keepdim=True)
        return (x.float() * torch.rsqrt(ms + self.eps)).type_as(x) * self.weight


def repeat_kv(x, n):
    if n == 1:
        return x
    b, t, g, d = x.shape
    return x[:, :, :, None, :].expand(b, t, g, n, d).reshape(b, t, g * n, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv = c["n_heads"], c["n_kv_heads"]
        self.hd = c["dim"] // self.nh
        self.wq = nn.Linear(c["dim"], self.nh * self.hd, bias=False)
        self.wk = nn.Linear(c["dim"], self.nkv * self.hd, bias=False)
        self.wv = nn.Linear(c["dim"], self.nkv * self.hd, bias=False)
        self.wo = nn.Linear(self.nh * self.hd, c["dim"], bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.nh, self.hd)
        k = self.wk(x).view(b, t, self.nkv, self.hd)
        v = self.wv(x).view(b, t, self.nkv, self.hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = repeat_kv(k, self.nh // self.nkv), repeat_kv(v, self.nh // self.nkv)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.hd) + mask
        o = F.softmax(s.float(), dim=-1).type_as(q) @ v
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm, self.ffn_norm = Norm(c["dim"], c["eps"]), Norm(c["dim"], c["eps"])
        self.attn = Attention(c)
        self.w1 = nn.Linear(c["dim"], c["hidden"], bias=False)
        self.w3 = nn.Linear(c["dim"], c["hidden"], bias=False)
        self.w2 = nn.Linear(c["hidden"], c["dim"], bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c["vocab_size"], c["dim"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = Norm(c["dim"], c["eps"])
        self.out = nn.Linear(c["dim"], c["vocab_size"], bias=False)
        self.out.weight = self.tok.weight
        cos, sin = rope_tables(c["dim"] // c["n_heads"], 2 * c["seq_length"], c["theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)
        h = self.tok(tokens)
        for blk in self.blocks:
            h = blk(h, self.cos[:t], self.sin[:t], mask)
        logits = self.out(self.norm(h)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

"""Issue 37: a model the runtime has no hand-written kernel for, written for
the fusion pass. RMS norms written out (x·rsqrt(mean(x²) + eps)·w), q and k
normalized per head the same way (QK-norm), attention written out with
softmax, and an MLP chosen by config["mlp"]: "geglu" (gelu_tanh(gate)·up,
Gemma's) or "sqrelu" (relu(x)², Primer's). config["norm"] = "layer" makes
every norm a LayerNorm written (x − mean)/sqrt(var + eps)·w + b. Exported with the generic
lowering (--no-recognize), every one of these is a chain of algebra ops
that --mapp-fuse turns into mapp.fused regions."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LayerNorm(nn.Module):
    def __init__(self, dim, eps, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x):
        xc = x - x.mean(-1, keepdim=True)
        var = (xc * xc).mean(-1, keepdim=True)
        y = xc / torch.sqrt(var + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


def make_norm(c, dim, bias=True):
    if c.get("norm") == "layer":
        return LayerNorm(dim, c["eps"], bias)
    return Norm(dim, c["eps"])


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h = c["dim"], c["hidden"]
        self.nh, self.hd = c["n_heads"], d // c["n_heads"]
        self.mlp = c["mlp"]
        self.attn_norm, self.mlp_norm = make_norm(c, d), make_norm(c, d)
        # QK-norm without a bias: a bias on k shifts all of a query's scores
        # alike, which softmax removes (its gradient is rounding noise).
        self.q_norm, self.k_norm = make_norm(c, self.hd, False), make_norm(c, self.hd, False)
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, h, bias=False)
        self.gate = nn.Linear(d, h, bias=False) if self.mlp == "geglu" else None
        self.down = nn.Linear(h, d, bias=False)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).split(d, dim=-1)
        q = self.q_norm(q.view(b, t, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(k.view(b, t, self.nh, self.hd)).transpose(1, 2)
        v = v.view(b, t, self.nh, self.hd).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        w = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        x = x + self.wo((w @ v).transpose(1, 2).reshape(b, t, d))
        n = self.mlp_norm(x)
        if self.mlp == "geglu":
            act = F.gelu(self.gate(n), approximate="tanh") * self.up(n)
        else:
            act = torch.relu(self.up(n)).square()
        return x + self.down(act)


class FusedMlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c["vocab_size"], c["dim"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.norm = make_norm(c, c["dim"])
        self.out = nn.Linear(c["dim"], c["vocab_size"], bias=False)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x, mask)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

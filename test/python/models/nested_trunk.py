"""A GPT whose blocks are an nn.Sequential two modules deep
(`backbone.trunk.N`, run as one call of the Sequential), each block's MLP
an nn.ModuleList of its two Linears (`backbone.trunk.N.ffn.0`: an index
inside the block), attention with separate q/k/v Linears and a mask made in forward
(masked_fill of triu(1)), an RMS norm written with rsqrt, a final norm and an untied
head outside the trunk. The block container is neither "layers" nor at
the top (docs/design.md, "Blocks by name")."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.pre_attn = RMSNorm(d)
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.proj = nn.Linear(d, d, bias=False)
        self.pre_ffn = RMSNorm(d)
        self.ffn = nn.ModuleList([nn.Linear(d, hidden), nn.Linear(hidden, d)])

    def forward(self, x):
        B, T, C = x.shape
        h = self.pre_attn(x)
        q, k, v = (m(h).view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        s = (q @ k.transpose(-2, -1)) * (C // self.heads) ** -0.5
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        y = s.masked_fill(future, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        up, down = self.ffn
        return x + down(F.gelu(up(self.pre_ffn(x))))


class NestedTrunk(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.tok = nn.Embedding(c["vocab_size"], d)
        self.backbone = nn.Module()
        self.backbone.trunk = nn.Sequential(*(Block(d, c["heads"], c["hidden"])
                                              for _ in range(c["n_layers"])))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, c["vocab_size"], bias=False)

    def forward(self, idx, targets):
        x = self.backbone.trunk(self.tok(idx))
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

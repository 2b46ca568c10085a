"""torch >= 2 style: F.scaled_dot_product_attention, is_causal=True in one
layer and an explicit bool tril mask in the other; qkv via view + unbind;
RMSNorm written out; SwiGLU; returns (logits, loss)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads, explicit_mask):
        super().__init__()
        self.heads, self.explicit_mask = heads, explicit_mask
        self.norm1 = nn.Parameter(torch.ones(dim))
        self.norm2 = nn.Parameter(torch.ones(dim))
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.rms(x, self.norm1)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.explicit_mask:
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        h = self.rms(x, self.norm2)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class SdpaGPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["dim"]
        self.tok = nn.Embedding(cfg["vocab_size"], d)
        self.pos = nn.Embedding(cfg["seq_length"], d)
        self.blocks = nn.ModuleList([Block(d, cfg["heads"], i % 2 == 1) for i in range(2)])
        self.head = nn.Linear(d, cfg["vocab_size"], bias=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, tokens, targets):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

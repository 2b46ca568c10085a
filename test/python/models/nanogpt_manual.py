"""Issue 38, written from its description: a nanoGPT-style model. One c_attn
projection split into q, k, v with .split(n_embd, dim=2); the causal mask
a registered tril "bias" buffer sliced to T and applied as
masked_fill(bias == 0, -inf); the tanh GELU written out
(0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))); LayerNorm with optional bias
through F.layer_norm; weight tying; learned positions from torch.arange."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd, bias=c["bias"])
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=c["bias"])
        n = c["block_size"]
        self.register_buffer("bias", torch.tril(torch.ones(n, n)).view(1, 1, n, n))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], c["bias"])
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = NewGELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = LayerNorm(c["n_embd"], c["bias"])
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

"""Issue 38, written from its description: a Gemma-like model whose rotary
is complex (torch.polar, view_as_complex) applied after the head
transpose; embeddings scaled by sqrt(hidden); RMSNorm with (1 + weight);
head_dim decoupled from hidden/heads; a GeGLU MLP whose gate and up come
out of one projection split with chunk(); logits soft-capped with tanh."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))  # used as 1 + weight

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.hd = c["heads"], c["head_dim"]
        self.q = nn.Linear(c["hidden"], self.nh * self.hd, bias=False)
        self.k = nn.Linear(c["hidden"], self.nh * self.hd, bias=False)
        self.v = nn.Linear(c["hidden"], self.nh * self.hd, bias=False)
        self.o = nn.Linear(self.nh * self.hd, c["hidden"], bias=False)
        self.scaling = c["query_pre_attn_scalar"] ** -0.5

    def forward(self, x, freqs, mask):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        qc = torch.view_as_complex(q.float().reshape(b, self.nh, t, -1, 2))
        kc = torch.view_as_complex(k.float().reshape(b, self.nh, t, -1, 2))
        q = torch.view_as_real(qc * freqs).reshape(b, self.nh, t, self.hd)
        k = torch.view_as_real(kc * freqs).reshape(b, self.nh, t, self.hd)
        scores = torch.matmul(q * self.scaling, k.transpose(2, 3))
        scores = scores.masked_fill(mask, float("-inf"))
        o = torch.matmul(scores.softmax(-1), v)
        return self.o(o.transpose(1, 2).reshape(b, t, -1))


class GemmaLike(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.embed = nn.Embedding(c["vocab_size"], h)
        self.layers = nn.ModuleList()
        for _ in range(c["layers"]):
            layer = nn.Module()
            layer.input_norm, layer.post_norm = RMSNorm(h, c["eps"]), RMSNorm(h, c["eps"])
            layer.attn = Attention(c)
            layer.gate_up = nn.Linear(h, 2 * c["ffn"], bias=False)
            layer.down = nn.Linear(c["ffn"], h, bias=False)
            self.layers.append(layer)
        self.norm = RMSNorm(h, c["eps"])
        self.cap = c["final_logit_softcapping"]
        t, d = c["seq_length"], c["head_dim"]
        ang = torch.outer(torch.arange(t).float(),
                          1.0 / c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        self.register_buffer("freqs", torch.polar(torch.ones_like(ang), ang), persistent=False)
        self.register_buffer("mask", torch.ones(t, t, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens) * (self.embed.weight.shape[1] ** 0.5)
        for layer in self.layers:
            x = x + layer.attn(layer.input_norm(x), self.freqs, self.mask)
            gate, up = layer.gate_up(layer.post_norm(x)).chunk(2, dim=-1)
            x = x + layer.down(F.gelu(gate, approximate="tanh") * up)
        logits = F.linear(self.norm(x), self.embed.weight)
        logits = torch.tanh(logits / self.cap) * self.cap
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

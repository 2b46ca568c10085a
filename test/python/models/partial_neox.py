"""Issue 38, written from its description: a GPT-NeoX/Pythia-like model
with partial rotary (rotary_pct of each head's dims, rotate-half, the rest
passed through and concatenated back), a parallel residual
(x + attn(ln1(x)) + mlp(ln2(x))), LayerNorm written out by hand (mean,
biased variance, rsqrt), and a boolean triu mask applied by masked_fill
with the dtype's most negative finite value."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class HandLayerNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) * torch.rsqrt(var + self.eps) * self.weight + self.bias


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class NeoXLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.hd = h // self.nh
        self.rot = int(self.hd * c["rotary_pct"])
        self.input_layernorm = HandLayerNorm(h, c["layer_norm_eps"])
        self.post_attention_layernorm = HandLayerNorm(h, c["layer_norm_eps"])
        self.query_key_value = nn.Linear(h, 3 * h)
        self.dense = nn.Linear(h, h)
        self.dense_h_to_4h = nn.Linear(h, 4 * h)
        self.dense_4h_to_h = nn.Linear(4 * h, h)

    def attention(self, x, cos, sin, mask):
        b, t, _ = x.shape
        qkv = self.query_key_value(x).view(b, t, self.nh, 3 * self.hd).permute(0, 2, 1, 3)
        q, k, v = qkv.split(self.hd, dim=-1)
        r = self.rot
        q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd)
        s = s.masked_fill(mask, torch.finfo(s.dtype).min)
        o = torch.matmul(F.softmax(s, dim=-1), v)
        return self.dense(o.permute(0, 2, 1, 3).reshape(b, t, -1))

    def forward(self, x, cos, sin, mask):
        mlp = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))
        return x + self.attention(self.input_layernorm(x), cos, sin, mask) + mlp


class NeoX(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_in = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(NeoXLayer(c) for _ in range(c["num_hidden_layers"]))
        self.final_layer_norm = HandLayerNorm(c["hidden_size"], c["layer_norm_eps"])
        self.embed_out = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        rot = int(c["hidden_size"] // c["num_attention_heads"] * c["rotary_pct"])
        inv = 1.0 / (c["rotary_emb_base"] ** (torch.arange(0, rot, 2).float() / rot))
        f = torch.outer(torch.arange(c["seq_length"]).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.embed_in(tokens)
        for layer in self.layers:
            x = layer(x, self.cos[:t], self.sin[:t], mask)
        logits = self.embed_out(self.final_layer_norm(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

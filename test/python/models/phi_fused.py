"""Issue 38, written from its description: a Phi-3-like model with fused
projections. qkv_proj split by sizes into q and grouped k/v; gate_up_proj
split with chunk(2); SiLU written out as x * sigmoid(x); rotate-half
rotary from cos/sin caches registered as buffers and sliced to the
sequence; the mask applied by torch.where(causal, scores, -inf tensor);
RMSNorm through a hand-written mean of squares and torch.sqrt division."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Phi3RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Phi3Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.nh, self.nkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = h // self.nh
        self.qkv_proj = nn.Linear(h, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False)
        self.gate_up_proj = nn.Linear(h, 2 * c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)
        self.input_layernorm = Phi3RMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = Phi3RMSNorm(h, c["rms_norm_eps"])

    def attn(self, x, cos, sin, causal):
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).split(
            [self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(b, t, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.nkv, self.hd).transpose(1, 2)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        k = torch.repeat_interleave(k, self.nh // self.nkv, dim=1)
        v = torch.repeat_interleave(v, self.nh // self.nkv, dim=1)
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
        s = torch.where(causal, s, torch.tensor(float("-inf")))
        o = torch.matmul(F.softmax(s, dim=-1), v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(o)

    def forward(self, x, cos, sin, causal):
        x = x + self.attn(self.input_layernorm(x), cos, sin, causal)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(up * (gate * torch.sigmoid(gate)))


class Phi3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Phi3Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = Phi3RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        d = c["hidden_size"] // c["num_attention_heads"]
        n = c["max_position_embeddings"]
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        f = torch.outer(torch.arange(n).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, input_ids, labels):
        t = input_ids.shape[1]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, self.cos_cached[:t], self.sin_cached[:t], self.causal[:t, :t])
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))

"""Issue 38, written from its description: a Mistral-like model with a
sliding attention window built by hand (torch.triu and torch.tril of a
ones matrix combined, applied with masked_fill) and GPT-J's interleaved
rotary, rotate_every_two, written with strided slices x[..., ::2] /
x[..., 1::2], torch.stack and flatten, the sin/cos tables
repeat_interleave'd per pair; an RMSNorm module; SwiGLU."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_every_two(x):
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class MistralRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class MistralLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.hd = h // self.nh
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)
        self.input_layernorm = MistralRMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = MistralRMSNorm(h, c["rms_norm_eps"])

    def forward(self, x, sin, cos, blocked):
        b, t, h = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, t, self.nh, self.hd)
        k = self.k_proj(y).view(b, t, self.nh, self.hd)
        v = self.v_proj(y).view(b, t, self.nh, self.hd).transpose(1, 2)
        q = (q * cos + rotate_every_two(q) * sin).transpose(1, 2)
        k = (k * cos + rotate_every_two(k) * sin).transpose(1, 2)
        s = q @ k.transpose(-1, -2) * self.hd ** -0.5
        s = s.masked_fill(blocked, float("-inf"))
        o = (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, h)
        x = x + self.o_proj(o)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Mistral(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(MistralLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = MistralRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.window = c["sliding_window"]
        self.theta = c["rope_theta"]
        self.hd = c["hidden_size"] // c["num_attention_heads"]

    def forward(self, input_ids, labels):
        t = input_ids.shape[1]
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.einsum("i,j->ij", torch.arange(t).float(), inv)
        sin = torch.repeat_interleave(ang.sin(), 2, dim=-1)[None, :, None, :]
        cos = torch.repeat_interleave(ang.cos(), 2, dim=-1)[None, :, None, :]
        ones = torch.ones(t, t, dtype=torch.bool)
        # Blocked: the future, and the past beyond the window.
        blocked = torch.triu(ones, diagonal=1) | ~torch.triu(ones, diagonal=1 - self.window)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, sin, cos, blocked)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))

"""Issue 38, written from its description: a Qwen2-like model in Hugging
Face's style. q/k/v projections with biases, o without; rotate-half rotary
whose cos/sin are computed in forward from an inv_freq buffer and position
ids (large theta); an additive mask from torch.triu(torch.full(-inf));
RMSNorm as HF writes it (variance in float32, weight * hidden); SwiGLU with
separate gate/up projections; grouped-query attention; tied small model."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Qwen2RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class Qwen2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        self.q_proj = nn.Linear(c["hidden_size"], self.heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(c["hidden_size"], self.kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(c["hidden_size"], self.kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c["hidden_size"], bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(b, -1, t, self.head_dim)
        v = v[:, :, None].expand(b, self.kv_heads, rep, t, self.head_dim).reshape(b, -1, t, self.head_dim)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(o)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.self_attn = Qwen2Attention(c)
        self.input_layernorm = Qwen2RMSNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = Qwen2RMSNorm(h, c["rms_norm_eps"])
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Qwen2DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = Qwen2RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.lm_head.weight = self.embed_tokens.weight
        d = c["hidden_size"] // c["num_attention_heads"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids, labels):
        b, t = input_ids.shape
        position_ids = torch.arange(t).unsqueeze(0).expand(b, -1)
        freqs = (self.inv_freq[None, :, None].expand(b, -1, 1) @ position_ids[:, None, :].float())
        emb = torch.cat((freqs.transpose(1, 2),) * 2, dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)[None, None]
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))

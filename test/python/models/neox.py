"""GPT-NeoX / Pythia style: parallel residual x + attn(ln1 x) + mlp(ln2 x),
query_key_value laid out per head ([B,T,nh,3D] split on the last dim),
rotary on q/k after the head permute, an additive triu(-inf) mask registered
as a buffer, softmax in float, exact F.gelu, untied embed_out."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, max_pos, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(max_pos).type_as(inv_freq)
        freqs = torch.einsum("i,j->ij", t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos()[None, None, :, :], persistent=False)
        self.register_buffer("sin_cached", emb.sin()[None, None, :, :], persistent=False)

    def forward(self, seq_len):
        return self.cos_cached[:, :, :seq_len, ...], self.sin_cached[:, :, :seq_len, ...]


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class GPTNeoXAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config["num_attention_heads"]
        self.hidden_size = config["hidden_size"]
        self.head_size = self.hidden_size // self.num_attention_heads
        n = config["max_position_embeddings"]
        self.register_buffer("masked_bias", torch.triu(torch.full((n, n), float("-inf")), 1),
                             persistent=False)
        self.rotary_emb = RotaryEmbedding(self.head_size, n)
        self.query_key_value = nn.Linear(self.hidden_size, 3 * self.hidden_size)
        self.dense = nn.Linear(self.hidden_size, self.hidden_size)
        self.norm_factor = math.sqrt(self.head_size)

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states)
        qkv = qkv.view(b, t, self.num_attention_heads, 3 * self.head_size)
        query = qkv[..., : self.head_size].permute(0, 2, 1, 3)
        key = qkv[..., self.head_size: 2 * self.head_size].permute(0, 2, 1, 3)
        value = qkv[..., 2 * self.head_size:].permute(0, 2, 1, 3)
        cos, sin = self.rotary_emb(t)
        query = (query * cos) + (rotate_half(query) * sin)
        key = (key * cos) + (rotate_half(key) * sin)
        attn_scores = torch.matmul(query, key.transpose(-1, -2)) / self.norm_factor
        attn_scores = attn_scores + self.masked_bias[:t, :t]
        attn_weights = F.softmax(attn_scores.float(), dim=-1).to(value.dtype)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous().view(b, t, self.hidden_size)
        return self.dense(attn_output)


class GPTNeoXMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(config["hidden_size"], config["intermediate_size"])
        self.dense_4h_to_h = nn.Linear(config["intermediate_size"], config["hidden_size"])

    def forward(self, hidden_states):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(hidden_states)))


class GPTNeoXLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config["hidden_size"], eps=config["layer_norm_eps"])
        self.post_attention_layernorm = nn.LayerNorm(config["hidden_size"], eps=config["layer_norm_eps"])
        self.attention = GPTNeoXAttention(config)
        self.mlp = GPTNeoXMLP(config)

    def forward(self, hidden_states):
        attn_output = self.attention(self.input_layernorm(hidden_states))
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return mlp_output + attn_output + hidden_states


class GPTNeoXForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_in = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList([GPTNeoXLayer(config) for _ in range(config["num_hidden_layers"])])
        self.final_layer_norm = nn.LayerNorm(config["hidden_size"], eps=config["layer_norm_eps"])
        self.embed_out = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids, labels):
        hidden_states = self.embed_in(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        logits = self.embed_out(self.final_layer_norm(hidden_states))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return (loss, logits)

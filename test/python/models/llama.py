"""Meta LLaMA style: separate wq/wk/wv/wo without bias, RMSNorm module with
float()/type_as, rotary cos/sin computed in forward (rotate-half form),
additive float causal mask built in forward, SwiGLU w2(silu(w1 x) * w3 x),
untied output head, returns a dataclass."""

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class CausalLMOutput:
    loss: torch.Tensor
    logits: torch.Tensor


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads = args["n_heads"]
        self.head_dim = args["dim"] // args["n_heads"]
        self.wq = nn.Linear(args["dim"], args["dim"], bias=False)
        self.wk = nn.Linear(args["dim"], args["dim"], bias=False)
        self.wv = nn.Linear(args["dim"], args["dim"], bias=False)
        self.wo = nn.Linear(args["dim"], args["dim"], bias=False)
        self.theta = args["rope_theta"]

    def forward(self, x, mask):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        t = torch.arange(seqlen, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        xq, xk = apply_rotary_pos_emb(xq, xk, emb.cos()[None, None], emb.sin()[None, None])
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, xv)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args["dim"], args["hidden_dim"])
        self.attention_norm = RMSNorm(args["dim"], eps=args["norm_eps"])
        self.ffn_norm = RMSNorm(args["dim"], eps=args["norm_eps"])

    def forward(self, x, mask):
        h = x + self.attention(self.attention_norm(x), mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, params):
        super().__init__()
        self.tok_embeddings = nn.Embedding(params["vocab_size"], params["dim"])
        self.layers = nn.ModuleList([TransformerBlock(params) for _ in range(params["n_layers"])])
        self.norm = RMSNorm(params["dim"], eps=params["norm_eps"])
        self.output = nn.Linear(params["dim"], params["vocab_size"], bias=False)

    def forward(self, tokens, targets):
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        mask = torch.full((seqlen, seqlen), float("-inf"))
        mask = torch.triu(mask, diagonal=1)
        for layer in self.layers:
            h = layer(h, mask)
        logits = self.output(self.norm(h)).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-100, reduction="mean")
        return CausalLMOutput(loss=loss, logits=logits)

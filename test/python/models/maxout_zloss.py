"""Written for issue 37 from descriptions of real code that takes maxima:
a maxout MLP (Goodfellow et al.: the max of k linear pieces, written as a
view and .max(-1)[0]); attention with a hand-written stable softmax (the
scores minus their row max, not detached, as pre-SDPA code does); PaLM's
z-loss on the logits with torch.logsumexp; a second log-sum-exp written
by hand with torch.amax, detached; and torch.max of two tensors (an
elementwise max of the two residual branches' gates)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def stable_softmax(scores):
    scores = scores - scores.max(dim=-1, keepdim=True).values
    e = torch.exp(scores)
    return e / e.sum(dim=-1, keepdim=True)


class Maxout(nn.Module):
    def __init__(self, d, hidden, pieces):
        super().__init__()
        self.pieces = pieces
        self.up = nn.Linear(d, hidden * pieces)
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        h = self.up(x)
        h = h.view(*h.shape[:-1], -1, self.pieces).max(-1)[0]
        return self.down(h)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.nh, self.hd = c["n_heads"], d // c["n_heads"]
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = Maxout(d, c["hidden"], c["pieces"])
        self.gate_a = nn.Parameter(torch.full((d,), 0.5))
        self.gate_b = nn.Parameter(torch.full((d,), 0.25) + 0.1 * torch.randn(d))

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.nh, self.hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = stable_softmax(att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")))
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))
        return x + torch.max(self.gate_a, self.gate_b) * self.mlp(self.ln2(x))


class MaxoutGPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.tok = nn.Embedding(c["vocab_size"], d)
        self.pos = nn.Embedding(c["seq_length"], d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layers"]))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, c["vocab_size"], bias=False)
        self.register_buffer("mask", torch.tril(torch.ones(c["seq_length"], c["seq_length"]))
                             .view(1, 1, c["seq_length"], c["seq_length"]))

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = self.head(self.ln_f(x))
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        z_loss = 1e-2 * torch.logsumexp(logits, dim=-1).pow(2).mean()
        m = torch.amax(logits, dim=-1, keepdim=True).detach()
        lse = (m + torch.log(torch.exp(logits - m).sum(-1, keepdim=True))).squeeze(-1)
        return ce + z_loss + 1e-3 * lse.mean()

"""Ties at a max, where torch.amax's gradient rule shows: two gates that
start equal (both ones) scale the same features and torch.amax takes the
larger, so every element is a tie and each gate gets half of the gradient
(torch.max(x, dim) would give all of it to one; mapp follows amax for
both). The gates get equal updates, so the ties last the whole run."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TiedMaxima(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.emb = nn.Embedding(c["vocab_size"], d)
        self.up = nn.Linear(d, d)
        self.gate_a = nn.Parameter(torch.ones(d))
        self.gate_b = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, c["vocab_size"])

    def forward(self, tokens, targets):
        h = F.silu(self.up(self.emb(tokens)))
        h = torch.stack([h * self.gate_a, h * self.gate_b], dim=-1).amax(dim=-1)
        logits = self.head(h)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

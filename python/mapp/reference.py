"""Reference GPT / LLaMA model: the numerical oracle of mapp.

Everything mapp computes (exporter output, config importer output, the CPU and
CUDA runtimes) is compared against this module, so it is written plainly, op
by op, in fp32.  docs/models.md describes the architecture and the parameter
names; keep the two in sync.

    model = GPT(config)            # config: dict with Megatron/HF keys
    loss = model(tokens, targets)  # tokens, targets: [B, T] int; loss: scalar
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import normalize_config
from .moe import MoE, moe_layers


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * weight (LLaMA form, no bias)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _norm(cfg):
    h = cfg["hidden_size"]
    if cfg["variant"] == "llama":
        return RMSNorm(h, cfg["layernorm_epsilon"])
    return nn.LayerNorm(h, eps=cfg["layernorm_epsilon"])


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(nn.Module):
    """Rotary position embedding, "rotate half" form (LLaMA / GPT-NeoX).

    cos/sin tables are computed in forward (not buffers) so the state_dict
    holds parameters only and a trace sees them as constants of the graph.
    """

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base

    def tables(self, t, device):
        d = self.head_dim
        inv_freq = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        pos = torch.arange(t, dtype=torch.float64)
        ang = torch.outer(pos, inv_freq)  # [T, D/2]
        ang = torch.cat((ang, ang), dim=-1)  # [T, D]
        return ang.cos().float().to(device), ang.sin().float().to(device)

    def forward(self, x, cos, sin):  # x: [B, heads, T, D]
        return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused qkv projection; with
    grouped-query attention (num_query_groups < heads) separate q, k, v
    projections, k and v of num_query_groups heads, query head i using
    key/value head i // (heads / num_query_groups)."""

    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden_size"]
        bias = cfg["variant"] == "gpt"
        self.heads = cfg["num_attention_heads"]
        self.head_dim = h // self.heads
        self.kv_heads = cfg.get("num_query_groups", self.heads)
        if self.kv_heads != self.heads:
            kv = self.kv_heads * self.head_dim
            self.q = nn.Linear(h, h, bias=bias)
            self.k = nn.Linear(h, kv, bias=bias)
            self.v = nn.Linear(h, kv, bias=bias)
        else:
            self.qkv = nn.Linear(h, 3 * h, bias=bias)
        self.proj = nn.Linear(h, h, bias=bias)
        self.rotary = Rotary(self.head_dim, cfg["rotary_base"]) if cfg["variant"] == "llama" else None
        self.attn_dropout = cfg["attention_dropout"]

    def forward(self, x):
        b, t, h = x.shape
        if self.kv_heads != self.heads:
            q, k, v = self.q(x), self.k(x), self.v(x)
        else:
            q, k, v = self.qkv(x).split(h, dim=2)
        # [B, T, H] -> [B, heads, T, D]: head i owns columns i*D .. i*D+D-1.
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary is not None:
            cos, sin = self.rotary.tables(t, x.device)
            q = self.rotary(q, cos, sin)
            k = self.rotary(k, cos, sin)
        if self.kv_heads != self.heads:
            # repeat_interleave on the head dim, as expand + reshape.
            shape = (b, self.heads, t, self.head_dim)
            k = k[:, :, None].expand(b, self.kv_heads, self.heads // self.kv_heads,
                                     t, self.head_dim).reshape(shape)
            v = v[:, :, None].expand(b, self.kv_heads, self.heads // self.kv_heads,
                                     t, self.head_dim).reshape(shape)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = F.softmax(scores, dim=-1)
        probs = F.dropout(probs, self.attn_dropout, self.training)
        y = probs @ v  # [B, heads, T, D]
        y = y.transpose(1, 2).contiguous().view(b, t, h)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, f = cfg["hidden_size"], cfg["ffn_hidden_size"]
        self.llama = cfg["variant"] == "llama"
        if self.llama:  # SwiGLU
            self.gate = nn.Linear(h, f, bias=False)
            self.up = nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)
        else:
            self.approximate = cfg["gelu_approximate"]
            self.fc1 = nn.Linear(h, f)
            self.fc2 = nn.Linear(f, h)

    def forward(self, x):
        if self.llama:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, cfg, moe=False):
        super().__init__()
        self.ln1 = _norm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = _norm(cfg)
        self.mlp = MoE(cfg) if moe else MLP(cfg)
        self.dropout = cfg["hidden_dropout"]

    def forward(self, x):
        x = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        y = self.mlp(self.ln2(x))
        # An MoE MLP's auxiliary losses of this call, for the GPT to add.
        y, self.aux_losses = y if isinstance(self.mlp, MoE) else (y, [])
        x = x + F.dropout(y, self.dropout, self.training)
        return x


class TiedHead(nn.Module):
    """LM head that reuses the token embedding matrix.

    The embedding is held outside the module tree (in a tuple) so the
    state_dict has one entry, `wte.weight`, and no `lm_head.*` alias.
    """

    def __init__(self, embedding):
        super().__init__()
        self._embedding = (embedding,)

    def forward(self, x):
        return F.linear(x, self._embedding[0].weight)


class GPT(nn.Module):
    def __init__(self, config, seed=None):
        super().__init__()
        cfg = normalize_config(config)
        self.config = cfg
        h, v = cfg["hidden_size"], cfg["vocab_size"]
        self.wte = nn.Embedding(v, h)
        self.wpe = nn.Embedding(cfg["seq_length"], h) if cfg["variant"] == "gpt" else None
        self.embedding_dropout = cfg["hidden_dropout"]
        self.layers = nn.ModuleList(Block(cfg, moe) for moe in moe_layers(cfg))
        self.ln_f = _norm(cfg)
        if cfg["tie_embeddings"]:
            self.lm_head = TiedHead(self.wte)
        else:
            self.lm_head = nn.Linear(h, v, bias=False)
        self.reset_parameters(cfg["seed"] if seed is None else seed)

    @torch.no_grad()
    def reset_parameters(self, seed):
        """normal(0, 0.02) for matrices and embeddings, ones/zeros for norms
        and biases, drawn in state_dict order from one CPU generator."""
        gen = torch.Generator().manual_seed(int(seed))
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.fill_(1.0)

    def mapp_model_attrs(self):
        """The `mapp.model` module attributes the exporter writes (the
        normalized config, identical to what mapp-translate's importer writes:
        num_query_groups only for grouped-query models)."""
        attrs = dict(self.config)
        if attrs["num_query_groups"] == attrs["num_attention_heads"]:
            del attrs["num_query_groups"]
        return attrs

    def forward(self, tokens, targets):
        b, t = tokens.shape
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe.weight[:t]
        x = F.dropout(x, self.embedding_dropout, self.training)
        aux = []
        for layer in self.layers:
            x = layer(x)
            aux += layer.aux_losses
        x = self.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(b * t, -1), targets.reshape(b * t).long())
        # MoE load-balancing and z-losses, layer by layer (Megatron adds
        # them to the loss it differentiates).
        for a in aux:
            loss = loss + a
        return loss

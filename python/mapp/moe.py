"""Mixture-of-experts block of the reference GPT (docs/moe.md), Megatron's
semantics in plain PyTorch.

Each step of the layer is an op of a torch.library namespace "mapp" whose
kernel is the plain-PyTorch formula below, so a trace keeps it as one node
(torch.ops.mapp.moe_router, ...) that the exporter lowers to the mapp op of
the same name.  The ops are wrapped in autograd Functions whose backward
differentiates the same formulas, so training the reference in PyTorch gives
exactly autograd's gradients of Megatron's math.

    logits = router(x)                        [N, E]
    probs, experts = moe_router(logits, k)    top-k of the logits, softmax over the k
    slots, counts = moe_assign(...)           rows grouped by expert; capacity drops
    y = unpermute(fc2(act(fc1(permute(x)))))  weighted by probs
    aux = moe_aux_loss(logits, experts), z = moe_z_loss(logits)
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# -- the formulas ------------------------------------------------------------


def router(logits, topk):
    """Megatron's default (use_pre_softmax=False): probs [N,k], experts [N,k]."""
    scores, experts = torch.topk(logits, topk, dim=-1)
    return torch.softmax(scores, dim=-1), experts


def capacity(tokens, topk, num_experts, factor):
    """Megatron's get_capacity: rows an expert keeps per micro-batch."""
    return max(math.ceil((tokens * topk / num_experts) * factor), 1)


def assign(probs, experts, num_experts, cap=None):
    """slots [N,k] (row of each choice in the expert-sorted buffer, -1 when
    dropped) and counts [E].  With a capacity an expert keeps its `cap`
    highest-probability choices (ties: lower token; drop_policy="probs")."""
    n, k = experts.shape
    keep = torch.ones(n, k, dtype=torch.bool)
    if cap is not None:
        gates = torch.zeros(n, num_experts).scatter(1, experts, probs.detach())
        routed = torch.zeros(n, num_experts, dtype=torch.bool).scatter(1, experts, True)
        order = torch.sort(-gates, dim=0, stable=True).indices[:cap]
        chosen = torch.zeros(n, num_experts, dtype=torch.bool).scatter(0, order, True)
        keep = torch.gather(routed & chosen, 1, experts)
    counts = torch.zeros(num_experts, dtype=torch.long).scatter_add(
        0, experts[keep], torch.ones(int(keep.sum()), dtype=torch.long))
    # Kept choices sorted by (expert, token): their rank is their row.
    key = experts * n + torch.arange(n).unsqueeze(1)
    key = torch.where(keep, key, torch.full_like(key, num_experts * n))
    order = torch.argsort(key.reshape(-1), stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n * k)
    slots = torch.where(keep.reshape(-1), rank, torch.full_like(rank, -1))
    return slots.reshape(n, k), counts


def permute(x, slots):
    """y [N·k, H]: y[slots[n,j]] = x[n]; unused rows zero."""
    n, k = slots.shape
    flat = slots.reshape(-1)
    kept = flat >= 0
    rows = x.repeat_interleave(k, dim=0)[kept]
    return torch.zeros(n * k, x.shape[1], dtype=x.dtype).index_copy(0, flat[kept], rows)


def grouped_matmul(x, w, counts):
    """Expert e's rows (after those of experts < e) times w[e] [K, N]."""
    parts, start = [], 0
    for e, c in enumerate(counts.tolist()):
        parts.append(x[start:start + c] @ w[e])
        start += c
    parts.append(torch.zeros(x.shape[0] - start, w.shape[2], dtype=x.dtype))
    return torch.cat(parts)


def unpermute(y, probs, slots):
    """out [N, H] = Σ_j probs[n,j]·y[slots[n,j]] over kept choices."""
    kept = slots >= 0
    rows = y[slots.clamp(min=0)] * (probs * kept).unsqueeze(-1)
    return rows.sum(1)


def aux_loss(logits, experts, coeff):
    """Switch load balancing: coeff·E/(N²k)·Σ_e (Σ_n softmax(l)[n,e])·count_e,
    counts before any capacity drop."""
    n, e = logits.shape
    k = experts.shape[1]
    scores = torch.softmax(logits, dim=-1)
    per_expert = torch.zeros(e).scatter_add(0, experts.reshape(-1), torch.ones(n * k))
    return torch.sum(scores.sum(0) * per_expert) * (e * coeff / (n * n * k))


def z_loss(logits, coeff):
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * coeff


# -- torch.library ops (one trace node each) ----------------------------------

_SCHEMAS = {
    "moe_router": ("moe_router(Tensor logits, int topk) -> (Tensor, Tensor)", router),
    "moe_assign": ("moe_assign(Tensor probs, Tensor experts, int num_experts, int capacity) "
                   "-> (Tensor, Tensor)",
                   lambda p, e, n, c: assign(p, e, n, None if c <= 0 else c)),
    "moe_permute": ("moe_permute(Tensor x, Tensor slots) -> Tensor", permute),
    "moe_grouped_matmul": ("moe_grouped_matmul(Tensor x, Tensor w, Tensor counts) -> Tensor",
                           grouped_matmul),
    "moe_unpermute": ("moe_unpermute(Tensor y, Tensor probs, Tensor slots) -> Tensor", unpermute),
    "moe_aux_loss": ("moe_aux_loss(Tensor logits, Tensor experts, float coeff) -> Tensor",
                     aux_loss),
    "moe_z_loss": ("moe_z_loss(Tensor logits, float coeff) -> Tensor", z_loss),
}


def _kernel(fn):
    def run(*args):
        out = fn(*args)
        # A custom op's outputs must not alias its inputs.
        if isinstance(out, tuple):
            return tuple(o.clone() for o in out)
        return out.clone()
    return run


def _register():
    if hasattr(torch.ops, "mapp") and hasattr(torch.ops.mapp, "moe_router"):
        return None  # imported twice under different names
    lib = torch.library.Library("mapp", "DEF")
    for name, (schema, fn) in _SCHEMAS.items():
        lib.define(schema)
        lib.impl(name, _kernel(fn), "CPU")
    return lib


_LIB = _register()


def _call(name, *args):
    """torch.ops.mapp.<name>(*args), differentiable: backward is autograd of
    the plain formula on the float inputs."""
    return _Differentiable.apply(name, *args)


class _Differentiable(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, *args):
        ctx.name, ctx.args = name, args
        out = getattr(torch.ops.mapp, name)(*args)
        outs = out if isinstance(out, tuple) else (out,)
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return out

    @staticmethod
    def backward(ctx, *grads):
        fn = _SCHEMAS[ctx.name][1]
        with torch.enable_grad():
            args = [a.detach().requires_grad_() if isinstance(a, torch.Tensor)
                    and a.is_floating_point() else a for a in ctx.args]
            out = fn(*args)
            outs = out if isinstance(out, tuple) else (out,)
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if o.is_floating_point() and g is not None and o.requires_grad]
            inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
            got = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs],
                                      allow_unused=True) if pairs and inputs else [None] * len(inputs)
        it = iter(got)
        return (None,) + tuple(next(it) if isinstance(a, torch.Tensor) and a.requires_grad
                               else None for a in args)


# -- modules ---------------------------------------------------------------------


def moe_layers(cfg):
    """[bool] per layer: which layers have an MoE MLP (moe_layer_freq)."""
    if not cfg.get("num_moe_experts"):
        return [False] * cfg["num_layers"]
    return [bool(f) for f in cfg["moe_layer_freq"]]


class GroupedLinear(nn.Module):
    """E weight matrices [E, in, out] applied to the expert-sorted rows."""

    def __init__(self, experts, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, n_in, n_out))

    def forward(self, x, counts):
        return _call("moe_grouped_matmul", x, self.weight, counts)


class Experts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        e, h, f = cfg["num_moe_experts"], cfg["hidden_size"], cfg["moe_ffn_hidden_size"]
        if cfg["variant"] == "llama":  # SwiGLU experts
            self.gate = GroupedLinear(e, h, f)
            self.up = GroupedLinear(e, h, f)
            self.down = GroupedLinear(e, f, h)
        else:
            self.fc1 = GroupedLinear(e, h, f)
            self.fc2 = GroupedLinear(e, f, h)


class MoE(nn.Module):
    """Token-choice top-k MoE MLP (Megatron's MoELayer with GroupedMLP experts,
    no biases).  forward returns (y, [auxiliary losses]) for the GPT to add."""

    def __init__(self, cfg):
        super().__init__()
        self.num_experts = cfg["num_moe_experts"]
        self.topk = cfg["moe_router_topk"]
        self.aux_coeff = cfg["moe_aux_loss_coeff"]
        self.z_coeff = cfg["moe_z_loss_coeff"]
        self.capacity_factor = cfg.get("moe_capacity_factor")
        self.llama = cfg["variant"] == "llama"
        self.approximate = cfg["gelu_approximate"]
        self.router = nn.Linear(cfg["hidden_size"], self.num_experts, bias=False)
        self.experts = Experts(cfg)

    def forward(self, x):
        b, t, h = x.shape
        n = b * t
        logits = self.router(x).reshape(n, self.num_experts)
        flat = x.reshape(n, h)
        probs, experts = _call("moe_router", logits, self.topk)
        cap = 0 if self.capacity_factor is None else capacity(
            n, self.topk, self.num_experts, self.capacity_factor)
        slots, counts = _call("moe_assign", probs, experts, self.num_experts, cap)
        xp = _call("moe_permute", flat, slots)
        ex = self.experts
        if self.llama:
            hp = F.silu(ex.gate(xp, counts)) * ex.up(xp, counts)
            yp = ex.down(hp, counts)
        else:
            yp = ex.fc2(F.gelu(ex.fc1(xp, counts), approximate=self.approximate), counts)
        y = _call("moe_unpermute", yp, probs, slots).reshape(b, t, h)
        losses = []
        if self.aux_coeff > 0:
            losses.append(_call("moe_aux_loss", logits, experts, self.aux_coeff))
        if self.z_coeff > 0:
            losses.append(_call("moe_z_loss", logits, self.z_coeff))
        return y, losses

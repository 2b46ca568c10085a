"""Reference check of the tensor-parallel layout and gradient rules.

Simulates the IR that --mapp-tensor-parallel emits for one GPT layer, with
every tp rank in one process: parameters are sliced exactly as the
`shard_dim` / `shard_blocks` attributes describe (docs/plan-lowering.md),
collectives are autograd Functions that implement the gradient rules of
docs/semantics.md *per rank* (not torch's own differentiation of a sum), and
each rank computes its replica of the loss and back-propagates seed 1.
Checks, for tp in {2, 4} and with/without sequence parallelism, that every
rank's loss equals the single-rank loss and every rank's parameter gradient
equals the matching slice of the single-rank gradient. Also checks the
vocab-parallel cross-entropy gradient kernels' formulas.

    python3 tp_reference.py   # prints "ok" or raises
"""
import math

import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
B, T, H, NH, FF, V = 2, 8, 16, 4, 32, 32


# -- sharding as the ParamOp attributes describe ------------------------------
def shard(full, dim, tp, r, blocks=1):
    """Cut `full` along dim into `blocks` blocks, each into tp pieces; rank r
    holds piece r of every block, concatenated in block order."""
    return torch.cat([b.chunk(tp, dim)[r] for b in full.chunk(blocks, dim)], dim)


# -- collectives with the documented per-rank gradient rules ------------------
class AllReduceSum(torch.autograd.Function):  # g: gradient is the identity
    @staticmethod
    def forward(ctx, *xs):
        s = sum(xs)
        return tuple(s.clone() for _ in xs)

    @staticmethod
    def backward(ctx, *dys):
        return dys


class CopyToGroup(torch.autograd.Function):  # f: all-reduce the gradient
    @staticmethod
    def forward(ctx, *xs):
        return tuple(x.clone() for x in xs)

    @staticmethod
    def backward(ctx, *dys):
        s = sum(dys)
        return tuple(s.clone() for _ in dys)


class AllGather(torch.autograd.Function):  # gradient: reduce-scatter
    @staticmethod
    def forward(ctx, dim, *xs):
        ctx.dim, ctx.n = dim, len(xs)
        y = torch.cat(xs, dim)
        return tuple(y.clone() for _ in xs)

    @staticmethod
    def backward(ctx, *dys):
        s = sum(dys)
        return (None,) + tuple(c.clone() for c in s.chunk(ctx.n, ctx.dim))


class ReduceScatter(torch.autograd.Function):  # gradient: all-gather
    @staticmethod
    def forward(ctx, dim, *xs):
        ctx.dim = dim
        return tuple(c.clone() for c in sum(xs).chunk(len(xs), dim))

    @staticmethod
    def backward(ctx, *dys):
        y = torch.cat(dys, ctx.dim)
        return (None,) + tuple(y.clone() for _ in dys)


class ScatterToGroup(torch.autograd.Function):  # gradient: all-gather
    @staticmethod
    def forward(ctx, dim, *xs):
        ctx.dim = dim
        return tuple(x.chunk(len(xs), dim)[r].clone() for r, x in enumerate(xs))

    @staticmethod
    def backward(ctx, *dys):
        y = torch.cat(dys, ctx.dim)
        return (None,) + tuple(y.clone() for _ in dys)


# -- the ops (docs/semantics.md) -----------------------------------------------
def attention(q, k, v, heads):
    b, t, h = q.shape
    d = h // heads
    sp = lambda x: x.view(b, t, heads, d).transpose(1, 2)
    s = sp(q) @ sp(k).transpose(-1, -2) * 0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return (F.softmax(s, -1) @ sp(v)).transpose(1, 2).reshape(b, t, h)


def vocab_embedding(table, ids, r):
    vl = table.shape[0]
    local = ids - r * vl
    mask = (local >= 0) & (local < vl)
    return table[local.clamp(0, vl - 1)] * mask[..., None]


def vocab_ce_partials(logits, t, m, r):
    vl = logits.shape[-1]
    local = t - r * vl
    inside = (local >= 0) & (local < vl)
    tl = logits.gather(-1, local.clamp(0, vl - 1)[..., None])[..., 0] - m
    return torch.stack([torch.exp(logits - m[..., None]).sum(-1), tl * inside], -1)


def ce_from_partials(P):
    return (torch.log(P[..., 0]) - P[..., 1]).mean()


# -- reference (single rank) ---------------------------------------------------
def init():
    p = {"wte": torch.randn(V, H) * 0.3, "wpe": torch.randn(T, H) * 0.3,
         "ln1.w": 1 + 0.1 * torch.randn(H), "ln1.b": 0.1 * torch.randn(H),
         "qkv.w": torch.randn(3 * H, H) * 0.3, "qkv.b": 0.1 * torch.randn(3 * H),
         "proj.w": torch.randn(H, H) * 0.3, "proj.b": 0.1 * torch.randn(H),
         "ln2.w": 1 + 0.1 * torch.randn(H), "ln2.b": 0.1 * torch.randn(H),
         "fc1.w": torch.randn(FF, H) * 0.3, "fc1.b": 0.1 * torch.randn(FF),
         "fc2.w": torch.randn(H, FF) * 0.3, "fc2.b": 0.1 * torch.randn(H),
         "lnf.w": 1 + 0.1 * torch.randn(H), "lnf.b": 0.1 * torch.randn(H)}
    return {k: v.requires_grad_() for k, v in p.items()}


def reference(p, tok, tgt):
    x = p["wte"][tok] + p["wpe"]
    h = F.layer_norm(x, (H,), p["ln1.w"], p["ln1.b"])
    qkv = F.linear(h, p["qkv.w"], p["qkv.b"])
    a = attention(qkv[..., :H], qkv[..., H:2 * H], qkv[..., 2 * H:], NH)
    x = x + F.linear(a, p["proj.w"], p["proj.b"])
    h = F.layer_norm(x, (H,), p["ln2.w"], p["ln2.b"])
    x = x + F.linear(F.gelu(F.linear(h, p["fc1.w"], p["fc1.b"]), approximate="tanh"),
                     p["fc2.w"], p["fc2.b"])
    h = F.layer_norm(x, (H,), p["lnf.w"], p["lnf.b"])
    return F.cross_entropy(F.linear(h, p["wte"]).reshape(-1, V), tgt.reshape(-1))


# shard_dim / shard_blocks the pass gives each parameter (None: replicated).
SPEC = {"wte": (0, 1), "qkv.w": (0, 3), "qkv.b": (0, 3), "proj.w": (1, 1),
        "fc1.w": (0, 1), "fc1.b": (0, 1), "fc2.w": (1, 1)}


def tensor_parallel(p, tok, tgt, tp, sp):
    """Every rank's program, as the pass emits it; returns per-rank losses
    and per-rank parameter replicas/shards (leaves)."""
    ranks = []
    for r in range(tp):
        q = {}
        for k, v in p.items():
            d = SPEC.get(k)
            q[k] = (shard(v.detach(), d[0], tp, r, d[1]) if d else v.detach().clone()).requires_grad_()
        ranks.append(q)
    R = range(tp)
    # Vocab-parallel embedding: partial rows, summed (or reduce-scattered).
    e = [vocab_embedding(ranks[r]["wte"], tok, r) for r in R]
    if sp:
        e = ReduceScatter.apply(1, *e)
        wpe = ScatterToGroup.apply(0, *[ranks[r]["wpe"] for r in R])
        x = [e[r] + wpe[r] for r in R]
    else:
        e = AllReduceSum.apply(*e)
        x = [e[r] + ranks[r]["wpe"] for r in R]

    def par(name):  # a replicated parameter read in the sequence-parallel region
        ps = [ranks[r][name] for r in R]
        return CopyToGroup.apply(*ps) if sp else ps

    def enter(h):  # f, or the sequence all-gather
        return AllGather.apply(1, *h) if sp else CopyToGroup.apply(*h)

    def leave(y):  # g, or the sequence reduce-scatter
        return ReduceScatter.apply(1, *y) if sp else AllReduceSum.apply(*y)

    g, b = par("ln1.w"), par("ln1.b")
    h = enter([F.layer_norm(x[r], (H,), g[r], b[r]) for r in R])
    hl = H // tp
    qkv = [F.linear(h[r], ranks[r]["qkv.w"], ranks[r]["qkv.b"]) for r in R]
    a = [attention(qkv[r][..., :hl], qkv[r][..., hl:2 * hl], qkv[r][..., 2 * hl:], NH // tp) for r in R]
    o = leave([F.linear(a[r], ranks[r]["proj.w"]) for r in R])
    pb = par("proj.b")
    x = [x[r] + o[r] + pb[r] for r in R]
    g, b = par("ln2.w"), par("ln2.b")
    h = enter([F.layer_norm(x[r], (H,), g[r], b[r]) for r in R])
    f = [F.gelu(F.linear(h[r], ranks[r]["fc1.w"], ranks[r]["fc1.b"]), approximate="tanh") for r in R]
    m = leave([F.linear(f[r], ranks[r]["fc2.w"]) for r in R])
    fb = par("fc2.b")
    x = [x[r] + m[r] + fb[r] for r in R]
    g, b = par("lnf.w"), par("lnf.b")
    h = enter([F.layer_norm(x[r], (H,), g[r], b[r]) for r in R])
    logits = [F.linear(h[r], ranks[r]["wte"]) for r in R]
    # all_reduce max carries no gradient (the loss is shift invariant).
    gm = torch.stack([lg.detach().amax(-1) for lg in logits]).amax(0)
    parts = AllReduceSum.apply(*[vocab_ce_partials(logits[r], tgt, gm, r) for r in R])
    losses = [ce_from_partials(parts[r]) for r in R]
    torch.autograd.backward(losses, [torch.ones(()) for _ in R])
    return losses, ranks


def check_kernels():
    """The *_grad kernels of docs/semantics.md against autograd."""
    logits = torch.randn(B, T, V // 2, requires_grad=True)
    t = torch.randint(0, V, (B, T))
    m = logits.detach().amax(-1) + 0.3
    p = vocab_ce_partials(logits, t, m, 1)
    dp = torch.randn_like(p)
    (p * dp).sum().backward()
    vl = V // 2
    local = t - vl
    onehot = F.one_hot(local.clamp(0, vl - 1), vl) * ((local >= 0) & (local < vl))[..., None]
    mine = dp[..., :1] * torch.exp(logits.detach() - m[..., None]) + dp[..., 1:] * onehot
    assert torch.allclose(logits.grad, mine), "vocab_ce_partials_grad"
    P = torch.rand(B, T, 2) + 0.5
    P.requires_grad_()
    ce_from_partials(P).backward(torch.tensor(0.7))
    count = B * T
    mine = torch.stack([0.7 / count / P.detach()[..., 0], torch.full((B, T), -0.7 / count)], -1)
    assert torch.allclose(P.grad, mine), "ce_from_partials_grad"


def main():
    check_kernels()
    p = init()
    tok = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    ref = reference(p, tok, tgt)
    ref.backward()
    for tp in (2, 4):
        for sp in (False, True):
            losses, ranks = tensor_parallel(p, tok, tgt, tp, sp)
            for r in range(tp):
                assert abs(losses[r].item() - ref.item()) < 1e-10, (tp, sp, r, losses[r].item(), ref.item())
                for k, v in p.items():
                    d = SPEC.get(k)
                    want = shard(v.grad, d[0], tp, r, d[1]) if d else v.grad
                    got = ranks[r][k].grad
                    assert got is not None and torch.allclose(got, want, atol=1e-10), (tp, sp, r, k)
    print("ok")


if __name__ == "__main__":
    main()

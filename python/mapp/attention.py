"""The written-out causal attention pattern -> one mapp.attention.

    q, k, v: [B,T,H] (slices of a fused qkv, or anything else)
    qh = q.view(B,T,nh,D).transpose(1,2)          (same for k, v)
    [rotary: qh = qh*cos + rotate_half(qh)*sin     (same for k)]
    s  = (qh @ kh.transpose(-2,-1)) * scale        (or / sqrt(D))
    s  = s.masked_fill(triu(ones(T,T),1), -inf)    (or s + mask)
    p  = softmax(s, -1)
    o  = (p @ vh).transpose(1,2).reshape(B,T,H)

The head views are recognized by where their elements come from (Lazy.idx),
not by the exact sequence of aten view ops, so any view/expand/clone noise the
trace adds is fine.  The result of `p @ vh` is returned as a head view of the
mapp.attention output, so the closing transpose+reshape cancels out.
"""

import math

import torch

from . import algebra as alg
from . import complex_rotary as crot
from . import ir
from .values import Const, Lazy, Pending, Step, Tensor, Virtual, fail


class Scores(Pending):
    what = "attention scores q @ k^T"

    def __init__(self, q, k, shape, node):
        self.q, self.k, self.shape, self.node = q, k, tuple(shape), node
        self.scale = 1.0
        self.causal = False
        self.elem = "f32"

    def copy(self, **kw):
        s = Scores(self.q, self.k, self.shape, self.node)
        s.scale, s.causal = self.scale, self.causal
        for key, val in kw.items():
            setattr(s, key, val)
        return s

    def layout(self, step, node):
        # Splitting/merging the batch*heads dims only.
        if step.kind in ("reshape", "expand") and step.shape[-2:] == self.shape[-2:] and \
                math.prod(step.shape) == math.prod(self.shape):
            return self.copy(shape=step.shape)
        return None

    def materialize(self, ctx, user):
        a = self.q.materialize(ctx, user)
        b = self.k.materialize(ctx, user)
        mod = ctx.module(self.node)
        v = ctx.b.op("mapp.matmul", [a, b], a.shape[:-1] + b.shape[-1:], a.elem, module=mod)
        if self.scale != 1.0:
            v = ctx.b.op("mapp.scale", [v], v.shape, v.elem, {"factor": ir.F64(self.scale)}, module=mod)
        if v.shape != self.shape:
            v = ctx.b.op("mapp.reshape", [v], self.shape, v.elem, module=mod)
        if self.causal:  # not consumed by mapp.attention: the mask as an add
            t = self.shape[-1]
            mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1),
                                                 float("-inf"))
            v = alg.elementwise(ctx, user, "mapp.add", Tensor(v), Const(mask),
                                shape=self.shape).materialize(ctx, user)
        return v


class Probs(Pending):
    what = "attention probabilities softmax(q @ k^T)"

    def __init__(self, scores, shape):
        self.scores, self.shape, self.elem = scores, tuple(shape), "f32"

    def layout(self, step, node):
        if step.kind in ("reshape", "expand") and step.shape[-2:] == self.shape[-2:] and \
                math.prod(step.shape) == math.prod(self.shape):
            return Probs(self.scores, step.shape)
        return None

    def materialize(self, ctx, user):
        v = self.scores.materialize(ctx, user)
        v = ctx.b.op("mapp.softmax", [v], v.shape, v.elem, module=ctx.module(user))
        if tuple(v.shape) != tuple(self.shape):  # a reshape was applied to the probabilities
            v = ctx.b.op("mapp.reshape", [v], self.shape, v.elem, module=ctx.module(user))
        return v


# ---- rotary pieces -------------------------------------------------------

class Negated(Pending):
    what = "a negated tensor"

    def __init__(self, x, node):
        self.x, self.shape, self.elem, self.node = x, x.shape, x.elem, node

    def materialize(self, ctx, user):
        v = self.x.materialize(ctx, user)
        return ctx.b.op("mapp.scale", [v], v.shape, v.elem, {"factor": ir.F64(-1.0)},
                        module=ctx.module(self.node))


class RotateHalf(Pending):
    """cat(-x[..., D/2:], x[..., :D/2]) of x = Lazy(base, idx)."""

    what = "rotate_half(x)"

    def __init__(self, base, idx, parts, node):
        self.base, self.idx, self.parts, self.node = base, idx, parts, node
        self.shape, self.elem = tuple(idx.shape), base.elem

    def materialize(self, ctx, user):
        vs = [p.materialize(ctx, user) for p in self.parts]
        return ctx.b.op("mapp.concat", vs, self.shape, vs[0].elem,
                        {"dim": ir.I64(len(self.shape) - 1)}, module=ctx.module(self.node))


def rotate_half(node, parts, dim):
    """cat([Negated(Lazy hi), Lazy lo], -1) -> RotateHalf, else None."""
    if len(parts) != 2 or dim not in (-1, len(parts[1].shape) - 1):
        return None
    neg, lo = parts
    if not (isinstance(neg, Negated) and isinstance(neg.x, Lazy) and isinstance(lo, Lazy)):
        return None
    hi = neg.x
    if hi.base is not lo.base or hi.shape != lo.shape:
        return None
    idx = torch.cat([lo.idx(), hi.idx()], dim=-1)  # x = cat(lo, hi)
    return RotateHalf(hi.base, idx, parts, node)


class TimesTable(Pending):
    """x * C for a non-uniform constant C (cos or sin table of rotary)."""

    what = "a product with a constant table"

    def __init__(self, x, table, node):
        self.x, self.table, self.node = x, table, node
        self.shape, self.elem = x.shape, x.elem

    def materialize(self, ctx, user):
        return alg.elementwise(ctx, self.node, "mapp.mul", self.x, self.table) \
            .materialize(ctx, user)


class Rotated(Pending):
    """rotary(src) seen through `view` (a Lazy over a Virtual base)."""

    what = "rotary-embedded q or k"

    def __init__(self, src, base_freq, view, parts=None, node=None):
        self.src, self.base_freq, self.view = src, base_freq, view
        self.parts, self.node = parts, node  # the two TimesTable, the add
        self.shape, self.elem = view.shape, "f32"

    def layout(self, step, node):
        return Rotated(self.src, self.base_freq, self.view.then(step), self.parts, self.node)

    def materialize(self, ctx, user):
        # Not consumed by mapp.attention {rotary}: x·cos + rotate_half(x)·sin.
        v = alg.elementwise(ctx, self.node, "mapp.add", *self.parts).materialize(ctx, user)
        return alg.through_view(ctx, user, v, self.view)


def base_from_theta1(theta1, d):
    """rotary_base from the angle at position 1 of pair 1 (base^(-2/D)),
    rounded to an integer when that is within 1e-4; None when out of range."""
    if not 0.0 < theta1 < 1.0:
        return None
    base = theta1 ** (-d / 2.0)
    return float(round(base)) if abs(base - round(base)) <= 1e-4 * base else base


def _rotary_base(cos, sin, d):
    """Recovers rotary_base from the traced tables (cos/sin of t*base^(-2i/D)),
    rounds it to an integer when that is within 1e-4, and checks the tables
    against it; None when they are not rotary tables."""
    t = cos.shape[-2]
    if t < 2 or d < 4:
        return None
    base = base_from_theta1(math.atan2(float(sin[1, 1]), float(cos[1, 1])), d)
    if base is None:
        return None
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.outer(torch.arange(t, dtype=torch.float64), inv)
    ang = torch.cat((ang, ang), dim=-1)
    ok = torch.allclose(cos.double(), ang.cos(), atol=1e-5) and \
        torch.allclose(sin.double(), ang.sin(), atol=1e-5)
    return base if ok else None


def rotary(node, a, b):
    """add(x*cos, rotate_half(x)*sin) -> Rotated, else None."""
    if not (isinstance(a, TimesTable) and isinstance(b, TimesTable)):
        return None
    if isinstance(a.x, RotateHalf):
        a, b = b, a
    x, rh = a.x, b.x
    if not (isinstance(x, Lazy) and isinstance(rh, RotateHalf)) or len(x.shape) != 4:
        return None
    if x.base is not rh.base or not torch.equal(x.idx(), rh.idx):
        return None
    t, d = x.shape[-2:]
    cos, sin = a.table.val, b.table.val
    if cos.dim() < 2 or cos.shape[-2:] != (t, d) or sin.shape != cos.shape:
        return None
    cos = cos.reshape(-1, t, d)
    sin = sin.reshape(-1, t, d)
    if not (cos == cos[0]).all() or not (sin == sin[0]).all():
        return None
    base = _rotary_base(cos[0], sin[0], d)
    if base is None:
        return None
    return Rotated(x, base, Lazy(Virtual(x.shape), []), (a, b), node)


# ---- matching ------------------------------------------------------------

def _heads(idx3, nh, role):
    """The [B,nh,T,D] head view of a [B,T,H] index tensor (k: transposed)."""
    b, t, h = idx3.shape
    out = idx3.reshape(b, t, nh, h // nh).transpose(1, 2)
    return out.transpose(-2, -1) if role == "kT" else out


def _same(idx, expected, shape):
    return idx.numel() == expected.numel() and tuple(shape[-2:]) == tuple(expected.shape[-2:]) \
        and torch.equal(idx.reshape(-1), expected.reshape(-1))


def _repeat(idx, group):
    """Grouped-query attention: each key/value head [B,G,..] repeated for the
    `group` query heads that share it (repeat_interleave on the head dim)."""
    return idx if group == 1 else idx.repeat_interleave(group, dim=1)


def heads_operand(x, role, merged=False, group=1):
    """(value [B,T,H] as Lazy/Tensor, heads, rotary) when x is the head
    view of such a value for `role` (q, v: [..,T,D]; kT: [..,D,T]),
    each head repeated `group` times (k and v of grouped-query attention);
    rotary is None, the rotary_base of rotate-half rotary, or a ComplexRope
    for complex-form rotary (complex_rotary.py)."""
    if isinstance(x, crot.RotatedPairs):
        # Its own search covers merged layouts too (the qkv of one projection).
        return crot.heads_operand(x, role, group)
    if isinstance(x, Rotated):
        if role == "v":
            return None
        idx = x.view.idx()
        src = torch.arange(math.prod(x.src.shape)).reshape(x.src.shape)
        plain = _repeat(src, group) if src.dim() == 4 else src
        want = plain.transpose(-2, -1) if role == "kT" else plain
        if not _same(idx, want, x.shape):
            return None
        m = heads_operand(x.src, "q", merged)
        return (m[0], m[1], x.base_freq) if m and m[2] is None else None
    if not isinstance(x, Lazy) or isinstance(x.base, Virtual) or len(x.shape) < 3 or not x.steps:
        return None
    if merged:
        return _merged_heads(x, role) if group == 1 else None
    d = x.shape[-2] if role == "kT" else x.shape[-1]
    idx = x.idx()
    for k in range(len(x.steps) + 1):  # shortest first: the most original [B,T,H]
        pidx = x.idx(upto=k)
        if pidx.dim() != 3 or pidx.shape[-1] % d:
            continue
        nh = pidx.shape[-1] // d
        if _same(idx, _repeat(_heads(pidx, nh, role), group), x.shape):
            return x.prefix(k), nh, None
    return _merged_heads(x, role) if group == 1 else None


def _merged_heads(x, role):
    """Any [B,nh,T,D] head view (kT: [B,nh,D,T]) that is no plain split of a
    [B,T,H] value (heads interleaved with q/k/v, a [B,T,3,nh,D] permute):
    merge the heads back with a transpose + reshape, which mapp emits as
    real ops (simplified away where they cancel)."""
    idx = x.idx()
    for k in range(len(x.steps), -1, -1):  # the last 4-d view with the same element order
        pidx = x.idx(upto=k)
        shape = tuple(pidx.shape)
        while len(shape) > 4 and shape[0] == 1:  # qkv[i] of a [3,B,nh,T,D] view
            shape = shape[1:]
        if len(shape) != 4 or not torch.equal(pidx.reshape(-1), idx.reshape(-1)) \
                or shape[-2:] != tuple(x.shape[-2:]):
            continue
        b, nh, r, c = shape
        t, d = (c, r) if role == "kT" else (r, c)
        perm = (0, 3, 1, 2) if role == "kT" else (0, 2, 1, 3)
        node = x.steps[-1].node
        merged = x.prefix(k)
        for step in (Step("reshape", shape, node),
                     Step("transpose", (b, t, nh, d), node, perm=perm),
                     Step("reshape", (b, t, nh * d), node)):
            # then() hands back the plain base where the steps so far cancel
            merged = Lazy.of(merged).then(step)
        return merged, nh, None
    return None


def _groups(nh):
    return [g for g in range(1, nh + 1) if nh % g == 0]


def scores_operands(q, kT):
    """True when q @ kT is attention scores: q a head view, kT the transposed
    head view of keys (repeated per query group for grouped-query attention)."""
    mq = heads_operand(q, "q")
    return bool(mq) and any(heads_operand(kT, "kT", group=g) for g in _groups(mq[1]))


def is_causal_mask(mask, t, fill):
    """mask (bool, masked_fill) or additive (float) causal mask over [.., T, T]."""
    m = mask.val
    if m.dim() < 2 or tuple(m.shape[-2:]) != (t, t):
        return False
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    m = m.reshape(-1, t, t)
    if fill is not None:  # masked_fill(mask, fill)
        # A finite fill <= -1e4 (GPT-2's -1e4, finfo.min) gives the same fp32
        # softmax: exp(-1e4) underflows to 0 like exp(-inf).
        return fill <= -1e4 and m.dtype == torch.bool and bool((m == upper).all())
    want = torch.zeros(t, t, dtype=m.dtype).masked_fill(upper, float("-inf"))
    return m.is_floating_point() and bool((m == want).all())


def attention(ctx, node, probs, v):
    """probs @ v -> mapp.attention, or None when the operands don't fit."""
    s = probs.scores
    # Plain splits of [B,T,H] values first; else merge the [B,nh,T,D] views.
    # k and v: nh heads, or nh/group heads each repeated group times (GQA).
    for merged in (False, True):
        mq = heads_operand(s.q, "q", merged)
        if not mq:
            continue
        nh = mq[1]
        for group in _groups(nh) if not merged else [1]:
            mk = heads_operand(s.k, "kT", merged, group)
            mv = heads_operand(v, "v", merged, group)
            if mk and mv and mk[1] * group == nh and mv[1] * group == nh:
                break
        else:
            continue
        (q, nh, rq), (k, nhk, rk), (vv, nhv, rv) = mq, mk, mv
        if nhk == nhv and rq == rk and rv is None and k.shape == vv.shape and \
                q.shape[:-1] == k.shape[:-1]:
            break
    else:
        # Not the fused form (complex-form rotary that mapp.attention
        # {rotary} cannot take, say): the caller emits the generic ops.
        return None
    attrs = {"heads": ir.I64(nh), "scale": ir.F64(s.scale)}
    if s.causal:
        attrs["causal"] = ir.Unit()
    if rq is not None:
        attrs["rotary"] = ir.Unit()
        # Complex-form rotary: q and k arrive permuted to rotate-half order.
        attrs["rotary_base"] = ir.F64(rq.base if isinstance(rq, crot.ComplexRope) else rq)
    qv = q.materialize(ctx, node)
    kv = k.materialize(ctx, node)
    vv = vv.materialize(ctx, node)
    out = Tensor(ctx.b.op("mapp.attention", [qv, kv, vv], qv.shape, qv.elem, attrs,
                          module=ctx.module(node)))
    # probs @ v is the [.., T, D] head view of the output.
    b, t, h = qv.shape
    lazy = Lazy(out, [])
    for step in (Step("reshape", (b, t, nh, h // nh), node),
                 Step("transpose", (b, nh, t, h // nh), node, perm=(0, 2, 1, 3)),
                 Step("reshape", probs.shape[:-1] + (h // nh,), node)):
        lazy = lazy.then(step)
    return lazy


# ---- F.scaled_dot_product_attention (torch >= 2.0) -----------------------

def sdpa(ctx, node, q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """[B,nh,T,D] q, k, v -> mapp.attention (as the written-out pattern
    would be), or an error naming what does not fit."""
    if len(q.shape) != 4:
        fail(node, "scaled_dot_product_attention on other than [B, heads, T, D] tensors")
    t, d = q.shape[-2:]
    # _layout: k may be a pattern value (rotary-embedded) as well as a view.
    kt = ctx._layout(node, k, Step("transpose", k.shape[:-2] + (d, k.shape[-2]), node,
                                   perm=(0, 1, 3, 2)))
    s = Scores(q, kt, q.shape[:-1] + (k.shape[-2],), node)
    s.scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    if is_causal:
        s.causal = True
    if mask is not None:
        if not hasattr(mask, "val"):
            fail(node, "scaled_dot_product_attention with a mask that is not a constant")
        m = mask.val
        keep = m if m.dtype == torch.bool else None
        if keep is not None and is_causal_mask(type(mask)(~keep), t, float("-inf")) \
                or keep is None and is_causal_mask(mask, t, None):
            s.causal = True
        else:
            return _sdpa_generic(ctx, node, s, mask, v, dropout_p)
    if dropout_p:
        return _sdpa_generic(ctx, node, s, None, v, dropout_p)
    y = attention(ctx, node, Probs(s, s.shape), v)
    if y is None:
        fail(node, "scaled_dot_product_attention on q/k/v that are no head views mapp can merge")
    return y


def _sdpa_generic(ctx, node, s, mask, v, dropout_p):
    """softmax(scores + mask) (dropout) @ v as the tensor algebra's ops: a
    mask other than the causal one (sliding window, padding: boolean
    `keep` or additive), or attention dropout."""
    from . import patterns as pat
    scores = Tensor(s.materialize(ctx, node))
    if mask is not None:
        if mask.val.dtype == torch.bool:
            scores = alg.select(ctx, node, mask, scores, float("-inf"))
        else:
            scores = alg.elementwise(ctx, node, "mapp.add", scores, mask, shape=scores.shape)
    probs = alg.unary(ctx, node, "mapp.softmax", scores)
    if dropout_p:
        probs = pat.dropout(ctx, node, probs, float(dropout_p))
    pv = probs.materialize(ctx, node)
    vv = v.materialize(ctx, node)
    return Tensor(ctx.b.op("mapp.matmul", [pv, vv], pv.shape[:-1] + vv.shape[-1:], pv.elem,
                           module=ctx.module(node)))


"""Meta LLaMA's complex-form rotary -> mapp.attention {rotary}.

    xq_ = view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xq  = view_as_real(xq_ * freqs_cis).flatten(3)            (same for xk)
    freqs_cis = polar(ones, outer(t, base^(-2i/D)))            (a constant)

This rotates ADJACENT pairs (x[2i], x[2i+1]) of each head by t·θᵢ; mapp's
rotary (rotate-half form) rotates (x[i], x[i+D/2]) by the same angles.  With
P the per-head permutation interleaved -> halves (columns 0,2,4,..,1,3,5,..),
rotate_pairs(x) = P⁻¹ rotate_half(P x), and the scores only see q·k summed
over each head's D columns, which a permutation shared by q and k leaves
unchanged:

    attention(rotate_pairs(q), rotate_pairs(k), v)
        = attention {rotary}(P q, P k, v)          exactly

P is a reshape/transpose/reshape, so autodiff through it is exact too.  The
exporter therefore emits P on q and k (before any head transpose) and one
mapp.attention {rotary}; no complex value reaches mapp.  (Lowering the complex
product itself to mul/sub/add would need the cos/sin tables in the graph, and
mapp has no op for a non-uniform constant.)

Complex values stay pattern stages (`Pending`): any other use is an error
naming the aten op and the user's line.
"""

import collections
import itertools
import math

import torch

from .values import Const, Lazy, Pending, Step, Virtual, fail

# A complex-rotated q or k as heads_operand reports it: rotary base and the
# order of head columns the attention operand sees (q and k must agree).
ComplexRope = collections.namedtuple("ComplexRope", "base columns")

_ONLY_IN_ATTENTION = ("mapp takes complex values only as complex-form rotary, "
                      "view_as_real(view_as_complex(x) * freqs_cis) on the q and k of attention "
                      "with freqs_cis = polar(1, t * base^(-2i/D)) on adjacent pairs of each "
                      "head's D columns")


def is_complex(x):
    return isinstance(x, (Pairs, Product)) or (isinstance(x, Const) and x.val.is_complex())


class _Complex(Pending):
    """A stage of the complex-form rotary pattern; `what` says which."""

    def materialize(self, ctx, user):
        fail(user, f"consumes {self.what}, which mapp cannot express on its own: "
                   f"{_ONLY_IN_ATTENTION}")


class Pairs(_Complex):
    """view_as_complex(x): x [..., n, 2] real, read as n complex numbers."""

    def __init__(self, x, node):
        self.x, self.node = x, node
        self.shape, self.elem = tuple(x.shape[:-1]), "complex"
        self.what = "a complex tensor (view_as_complex)"


class Product(_Complex):
    """view_as_complex(x) * table, the table broadcast to x's complex shape."""

    def __init__(self, pairs, table, node):
        self.pairs, self.table, self.node = pairs, table, node
        self.shape, self.elem = pairs.shape, "complex"
        self.what = "a complex product"


class RotatedPairs(_Complex):
    """view_as_real(view_as_complex(x) * table) seen through `view` (a Lazy
    over a Virtual of x's real shape [..., n, 2]: element s of that shape is
    pair s // 2, component s % 2 of x rotated by the table)."""

    def __init__(self, x, table, view, node):
        self.x, self.table, self.view, self.node = x, table, view, node
        self.shape, self.elem = view.shape, "f32"
        self.what = "a complex-form rotary output (view_as_real(view_as_complex(x) * freqs_cis))"

    def layout(self, step, node):
        return RotatedPairs(self.x, self.table, self.view.then(step), self.node)

    def materialize(self, ctx, user):
        # Not consumed by mapp.attention {rotary}: the complex product as
        # real ops (algebra.py), then the layout changes applied since.
        from . import algebra as alg
        v = alg.rotate_pairs(ctx, self.node, self.x, self.table).materialize(ctx, user)
        return alg.through_view(ctx, user, v, self.view)


def view_as_complex(node, x):
    if isinstance(x, Pending) or not x.shape or x.shape[-1] != 2 or \
            x.elem not in ("f32", "f16", "bf16"):
        fail(node, f"view_as_complex of other than a float tensor [..., 2]; {_ONLY_IN_ATTENTION}")
    return Pairs(x, node)


def multiply(node, a, b, result_shape):
    """view_as_complex(x) * constant table -> Product; None when neither
    operand is complex; any other complex product is an error."""
    if not (is_complex(a) or is_complex(b)):
        return None
    for x, t in ((a, b), (b, a)):
        if isinstance(x, Pairs) and isinstance(t, Const) and t.val.is_complex() \
                and tuple(result_shape) == x.shape:
            try:
                table = torch.broadcast_to(t.val, x.shape)
            except RuntimeError:
                break
            return Product(x, table, node)
    fail(node, "complex multiply other than view_as_complex(x) by a constant table "
               f"(freqs_cis) of x's shape or broadcast to it; {_ONLY_IN_ATTENTION}")


def view_as_real(node, z):
    if isinstance(z, Product):
        return RotatedPairs(z.pairs.x, z.table, Lazy(Virtual(z.pairs.x.shape), []), z.pairs.node)
    if isinstance(z, Pairs):
        return z.x  # view_as_real(view_as_complex(x)) is x
    fail(node, f"view_as_real of other than view_as_complex(x) * freqs_cis; {_ONLY_IN_ATTENTION}")


def heads_operand(x, role, group=1):
    """(operand [B,T,H], heads, ComplexRope) when x (RotatedPairs) is the
    head view for `role` (q: [..,T,D], kT: [..,D,T]; v never) of a [B,T,H]
    value y rotated pairwise per head, each head repeated `group` times
    (grouped-query k), with freqs_cis the rotary table of some base; the
    operand is P y, which mapp.attention {rotary} rotates into the same
    numbers (module docstring).  Else None."""
    from . import attention as att
    if role == "v" or len(x.shape) < 3:
        return None
    d = x.shape[-2] if role == "kT" else x.shape[-1]
    if d % 2 or d < 4:
        return None
    src = x.x  # the unrotated [..., D/2, 2] real value
    vidx = x.view.idx().reshape(-1)  # element -> flat index into src's shape
    sidx = src.idx().reshape(-1) if isinstance(src, Lazy) else torch.arange(math.prod(src.shape))
    slot = sidx[vidx]          # flat index into src's base of each element's own slot
    partner = sidx[vidx ^ 1]   # ... and of the other half of its complex pair
    component = vidx % 2       # 0: real part, 1: imaginary part
    rot = x.table.reshape(-1)[vidx // 2]
    nbase = math.prod(_root(src).shape)
    for y in _candidates(src, d, x.node):
        if len(y.shape) != 3 or y.shape[-1] % d:
            continue
        b, t, h = y.shape
        nh = h // d
        yidx = (y.idx() if isinstance(y, Lazy) else torch.arange(b * t * h)).reshape(-1)
        if yidx.unique().numel() != yidx.numel():
            continue
        where = torch.full((nbase,), -1, dtype=torch.long)
        where[yidx] = torch.arange(yidx.numel())
        got, got_partner = where[slot], where[partner]  # flat [B,T,H] positions in y
        want = att._repeat(att._heads(torch.arange(b * t * h).reshape(b, t, h), nh, role), group)
        if (got < 0).any() or (got_partner < 0).any() or want.numel() != got.numel() \
                or tuple(want.shape[-2:]) != tuple(x.shape[-2:]):
            continue
        want = want.reshape(-1)
        # Each element in its head-view place up to a column order within the head...
        if not torch.equal(want // d, got // d):
            continue
        want_col, got_col = want % d, got % d
        columns = torch.full((d,), -1, dtype=torch.long)
        columns[want_col] = got_col
        if not torch.equal(columns[want_col], got_col) or \
                not torch.equal(columns.sort().values, torch.arange(d)):
            continue
        # ... holding column 2i (real) or 2i+1 (imaginary) of pair i, its
        # partner the other column of the same row and head.
        if not (torch.equal(got_col % 2, component) and torch.equal(got_partner, got ^ 1)):
            continue
        base = _table_base(rot, (got // h) % t, got_col // 2, d)
        if base is None:
            continue
        return _halves(y, nh, d, x.node), nh, \
            ComplexRope(base, tuple(columns.tolist()))
    return None


def _candidates(src, d, node):
    """[B,T,H] values whose rotation x may be: the 3-d views src was made
    from, the most original first (no ops to emit), then src's own
    [.., .., .., D/2, 2] elements with the three leading dims in each order
    and merged to [B,T,H] (q/k split from a fused projection, or rotated
    after the head transpose [B,heads,T,D])."""
    if isinstance(src, Lazy):
        for k in range(len(src.steps) + 1):
            y = src.prefix(k)
            if len(y.shape) == 3:
                yield y
    if len(src.shape) != 5 or src.shape[-2:] != (d // 2, 2):
        return
    for perm in itertools.permutations(range(3)):
        lead = tuple(src.shape[p] for p in perm)
        y = Lazy.of(src)
        if perm != (0, 1, 2):
            y = y.then(Step("transpose", lead + src.shape[3:], node, perm=perm + (3, 4)))
        yield y.then(Step("reshape", lead[:2] + (lead[2] * d,), node))


def _root(v):
    return v.base if isinstance(v, Lazy) else v


def _table_base(rot, pos, pair, d):
    """rotary base when rot (the table's complex value of each element) is
    exp(i·pos·base^(-2·pair/D)) within 1e-5, else None."""
    from . import attention as att
    at = ((pos == 1) & (pair == 1)).nonzero()
    if at.numel() == 0:
        return None
    z = rot[at[0, 0]]
    base = att.base_from_theta1(float(torch.atan2(z.imag, z.real)), d)
    if base is None:
        return None
    ang = pos.double() * base ** (-2.0 * pair.double() / d)
    ok = torch.allclose(rot.real.double(), ang.cos(), atol=1e-5) and \
        torch.allclose(rot.imag.double(), ang.sin(), atol=1e-5)
    return base if ok else None


def _halves(y, nh, d, node):
    """P y: per head, columns 0,2,..,D-2 then 1,3,..,D-1 (rotate-half order)."""
    b, t, h = y.shape
    lazy = Lazy.of(y)
    for step in (Step("reshape", (b * t * nh, d // 2, 2), node),
                 Step("transpose", (b * t * nh, 2, d // 2), node, perm=(0, 2, 1)),
                 Step("reshape", (b, t, h), node)):
        lazy = lazy.then(step)
    return lazy

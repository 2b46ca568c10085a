"""Generic lowering onto the dialect's tensor algebra (MappTensorOps.td).

Every aten op of the algebra maps to a mapp op here, with broadcasting made
explicit (mapp.broadcast, NumPy's rule), Python scalars as mapp.fill,
booleans as 0/1 floats and complex numbers as (real, imaginary) pairs of
real tensors.  The pattern stages of lower.py / patterns.py / attention.py
fall back to these when their pattern does not complete, and with
recognition switched off (`--no-recognize`, MAPP_RECOGNIZE=0) nothing else
is used: recognition only rewrites compositions into fused ops.
"""

import torch

from . import ir
from .values import Abstract, Const, Lazy, Step, Tensor, fail


def recognition_default():
    """MAPP_RECOGNIZE=0 (or off/false/no) switches pattern recognition off."""
    import os
    return os.environ.get("MAPP_RECOGNIZE", "1").strip().lower() not in ("0", "off", "false", "no")


def _is_scalar(x):
    return isinstance(x, (bool, int, float))


def shape_of(x):
    return () if _is_scalar(x) else tuple(x.shape)


def result_shape(node, *operands):
    try:
        return tuple(torch.broadcast_shapes(*(shape_of(o) for o in operands)))
    except RuntimeError:
        fail(node, "operands of shapes " + ", ".join(str(list(shape_of(o))) for o in operands)
             + " do not broadcast (NumPy's rule)")


def broadcast(ctx, node, v, shape):
    """ir.Value v repeated to `shape` (mapp.broadcast), or v itself."""
    shape = tuple(shape)
    if tuple(v.shape) == shape:
        return v
    lead = len(shape) - len(v.shape)
    if lead < 0 or any(d != 1 and d != shape[lead + i] for i, d in enumerate(v.shape)):
        fail(node, f"cannot broadcast {list(v.shape)} to {list(shape)}")
    return ctx.b.op("mapp.broadcast", [v], shape, v.elem, module=ctx.module(node))


def value(ctx, node, x, shape):
    """ir.Value of x (abstract value or Python scalar) broadcast to shape."""
    if _is_scalar(x):
        return ctx.b.op("mapp.fill", [], shape, "f32", {"value": ir.F64(float(x))}, named=False)
    v = x.materialize(ctx, node)
    if v.elem not in ("f32", "f16", "bf16"):
        fail(node, f"uses an {v.elem} tensor in arithmetic; mapp's arithmetic is on floats")
    return broadcast(ctx, node, v, shape)


def elementwise(ctx, node, name, *operands, shape=None):
    """mapp.<name> of the operands broadcast to their common shape."""
    shape = tuple(shape) if shape is not None else result_shape(node, *operands)
    vals = [value(ctx, node, o, shape) for o in operands]
    return Tensor(ctx.b.op(name, vals, shape, "f32", module=ctx.module(node)))


def unary(ctx, node, name, x, attrs=None):
    v = value(ctx, node, x, shape_of(x))
    return Tensor(ctx.b.op(name, [v], v.shape, v.elem, attrs, module=ctx.module(node)))


def scale(ctx, node, x, factor):
    v = value(ctx, node, x, shape_of(x))
    return Tensor(ctx.b.op("mapp.scale", [v], v.shape, v.elem, {"factor": ir.F64(factor)},
                           module=ctx.module(node)))


def reduce(ctx, node, name, x, dims, keepdim):
    """mapp.reduce_sum / mapp.reduce_max over `dims` (none: all of them),
    reshaped to keep them as 1 when keepdim."""
    v = value(ctx, node, x, shape_of(x))
    n = len(v.shape)
    dims = sorted({d % n for d in (dims if dims else range(n))}) if n else []
    if not dims:
        return Tensor(v)
    shape = tuple(s for i, s in enumerate(v.shape) if i not in dims)
    y = ctx.b.op(name, [v], shape, v.elem, {"dims": ir.Array(dims)},
                 module=ctx.module(node))
    if keepdim:
        kept = tuple(1 if i in dims else s for i, s in enumerate(v.shape))
        y = ctx.b.op("mapp.reshape", [y], kept, y.elem, module=ctx.module(node))
    return Tensor(y)


def reduce_sum(ctx, node, x, dims, keepdim):
    return reduce(ctx, node, "mapp.reduce_sum", x, dims, keepdim)


def reduce_max(ctx, node, x, dims, keepdim):
    return reduce(ctx, node, "mapp.reduce_max", x, dims, keepdim)


def reduce_min(ctx, node, x, dims, keepdim):
    """min as −max(−x): the dialect has one extremum reduction."""
    neg = unary(ctx, node, "mapp.neg", x)
    return unary(ctx, node, "mapp.neg", reduce_max(ctx, node, neg, dims, keepdim))


def mean(ctx, node, x, dims, keepdim):
    n = len(shape_of(x))
    dims = list(dims) if dims else list(range(n))
    count = 1
    for d in dims:
        count *= shape_of(x)[d % n]
    return scale(ctx, node, reduce_sum(ctx, node, x, dims, keepdim), 1.0 / count)


def select(ctx, node, cond, on_true, on_false):
    return elementwise(ctx, node, "mapp.select", cond, on_true, on_false)


def stack(ctx, node, xs, dim):
    """torch.stack: each operand gets a size-1 dim at `dim`, then concat."""
    shape = shape_of(xs[0])
    dim %= len(shape) + 1
    part = shape[:dim] + (1,) + shape[dim:]
    vals = [ctx.b.op("mapp.reshape", [value(ctx, node, x, shape)], part, "f32",
                     module=ctx.module(node)) for x in xs]
    out = part[:dim] + (len(xs),) + part[dim + 1:]
    return Tensor(ctx.b.op("mapp.concat", vals, out, "f32", {"dim": ir.I64(dim)},
                           module=ctx.module(node)))


# ---- complex numbers as (real, imaginary) pairs ------------------------------

class Complex(Abstract):
    """A complex tensor as two real ones of its shape."""

    elem = "complex"

    def __init__(self, re, im, shape):
        self.re, self.im, self.shape = re, im, tuple(shape)

    def materialize(self, ctx, user):
        fail(user, "uses a complex tensor where mapp needs a real one "
                   "(view_as_real turns it back into [..., 2] reals)")


def complex_of(ctx, node, x):
    """Complex view of x: a Complex, a complex constant (split in two), or
    view_as_complex of a real [..., 2] tensor."""
    if isinstance(x, Complex):
        return x
    if isinstance(x, Const) and x.val.is_complex():
        return Complex(Const(x.val.real.contiguous()), Const(x.val.imag.contiguous()), x.shape)
    if not x.shape or x.shape[-1] != 2:
        fail(node, f"view_as_complex of a tensor of shape {list(x.shape)} (the last dim must be 2)")
    parts = []
    for i in (0, 1):
        part = _layout(ctx, node, x, Step("slice", x.shape[:-1] + (1,), node,
                                          dim=len(x.shape) - 1, start=i, end=i + 1))
        parts.append(_layout(ctx, node, part, Step("reshape", x.shape[:-1], node)))
    return Complex(parts[0], parts[1], x.shape[:-1])


def _layout(ctx, node, x, step):
    return ctx._layout(node, x, step)


def complex_mul(ctx, node, a, b):
    a, b = complex_of(ctx, node, a), complex_of(ctx, node, b)
    shape = result_shape(node, a, b)
    mul = lambda x, y: elementwise(ctx, node, "mapp.mul", x, y, shape=shape)
    re = elementwise(ctx, node, "mapp.sub", mul(a.re, b.re), mul(a.im, b.im), shape=shape)
    im = elementwise(ctx, node, "mapp.add", mul(a.re, b.im), mul(a.im, b.re), shape=shape)
    return Complex(re, im, shape)


def view_as_real(ctx, node, z):
    return stack(ctx, node, [z.re, z.im], -1)


def rotate_pairs(ctx, node, x, table):
    """view_as_real(view_as_complex(x) * table) as real ops (the generic
    form of Meta's complex rotary)."""
    return view_as_real(ctx, node, complex_mul(ctx, node, complex_of(ctx, node, x),
                                               Const(table) if isinstance(table, torch.Tensor)
                                               else table))


def through_view(ctx, user, v, view):
    """ir.Value v seen through the layout steps of `view` (a Lazy over a
    Virtual of v's shape): how a pattern value that did not complete
    materializes after layout changes were applied to it."""
    return Lazy(Tensor(v), view.steps).materialize(ctx, user) if view.steps else v

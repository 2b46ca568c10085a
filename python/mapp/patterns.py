"""Small multi-op aten patterns: rms norm, dropout, cross entropy.

Each stage of a pattern is a `Pending` value; the last aten op of the pattern
emits the mapp op.  Used any other way, a stage either emits the plain ops it
stands for (where mapp has them) or is an error naming the op that broke the
pattern.
"""

import math

from . import algebra as alg
from . import ir
from .values import Pending, Tensor, fail


# rms norm: x * rsqrt(mean(x.pow(2), -1, keepdim) + eps) * weight

class Square(Pending):
    what = "x.pow(2)"

    def __init__(self, x):
        self.x, self.shape, self.elem = x, x.shape, x.elem

    def materialize(self, ctx, user):
        v = self.x.materialize(ctx, user)
        return ctx.b.op("mapp.mul", [v, v], v.shape, v.elem, module=user.meta.get("mapp_module", ""))


# Each stage that does not complete the pattern emits its generic ops.

class MeanSquare(Pending):
    what = "the mean of squares of an rms norm"

    def __init__(self, x, shape):
        self.x, self.shape = x, shape

    def materialize(self, ctx, user):
        sq = Tensor(Square(self.x).materialize(ctx, user))
        return alg.mean(ctx, user, sq, [-1], True).materialize(ctx, user)


class MeanSquareEps(Pending):
    what = "mean(x^2) + eps of an rms norm"

    def __init__(self, x, eps, shape):
        self.x, self.eps, self.shape = x, eps, shape

    def materialize(self, ctx, user):
        return alg.elementwise(ctx, user, "mapp.add", MeanSquare(self.x, self.shape),
                               self.eps).materialize(ctx, user)


class InvRms(Pending):
    what = "rsqrt(mean(x^2) + eps) of an rms norm"

    def __init__(self, x, eps, shape):
        self.x, self.eps, self.shape = x, eps, shape

    def materialize(self, ctx, user):
        return alg.unary(ctx, user, "mapp.rsqrt",
                         MeanSquareEps(self.x, self.eps, self.shape)).materialize(ctx, user)


class Normalized(Pending):
    what = "x * rsqrt(mean(x^2) + eps) (an rms norm without its weight)"

    def __init__(self, x, eps):
        self.x, self.eps, self.shape = x, eps, x.shape

    def materialize(self, ctx, user):
        inv = InvRms(self.x, self.eps, tuple(self.shape[:-1]) + (1,))
        return alg.elementwise(ctx, user, "mapp.mul", self.x, inv).materialize(ctx, user)


# dropout on CPU: mask = empty_like(x).bernoulli_(1-p).div_(1-p); y = x * mask

class MaskBuffer(Pending):
    what = "an uninitialized tensor (empty_like)"

    def __init__(self, shape):
        self.shape = shape


class KeepMask(Pending):
    what = "a random dropout keep mask"

    def __init__(self, keep, shape, scaled=False):
        self.keep, self.shape, self.scaled = keep, shape, scaled


def dropout(ctx, node, x, p):
    """mapp.dropout with the next seed: seeds number the dropout ops of a
    graph 0, 1, 2, ... in order (the config importer does the same)."""
    v = x.materialize(ctx, node)
    seed = ctx.next_dropout_seed()
    return Tensor(ctx.b.op("mapp.dropout", [v], v.shape, v.elem,
                           {"p": ir.F64(p), "seed": ir.I64(seed)}, module=ctx.module(node)))


# cross entropy: nll_loss(log_softmax(logits, -1), targets)

class LogSoftmax(Pending):
    what = "log_softmax (mapp only has it inside cross_entropy)"

    def __init__(self, x):
        self.x, self.shape = x, x.shape

    def materialize(self, ctx, user):
        # log(softmax(x)): exact in its gradient; its value underflows only
        # where a probability is below float's smallest normal.
        p = alg.unary(ctx, user, "mapp.softmax", self.x)
        return alg.unary(ctx, user, "mapp.log", p).materialize(ctx, user)


def cross_entropy(ctx, node, logsm, targets, reduction, ignore_index):
    from .values import Lazy
    if reduction != 1:
        fail(node, "only reduction='mean' cross entropy is supported")
    logits = logsm.x
    # [N, V] / [N] views of [..., V] / [...] tensors: use the originals.
    lb = logits.leading_reshape(True) if isinstance(logits, Lazy) else None
    tb = targets.leading_reshape(False) if isinstance(targets, Lazy) else None
    if lb is not None and tb is not None and tuple(lb.shape[:-1]) == tuple(tb.shape):
        logits, targets = lb, tb
    elif tb is not None and len(logits.shape) == 2 and \
            logits.shape[0] == math.prod(tb.shape) and not isinstance(logits, Pending):
        # [N, V] logits already flat (their reshape cancelled out): shape
        # them like the targets, not the integer targets like them.
        shape = tuple(tb.shape) + (logits.shape[-1],)
        lv = logits.materialize(ctx, node)
        logits = Tensor(ctx.b.op("mapp.reshape", [lv], shape, lv.elem, module=ctx.module(node)))
        targets = tb
    lv = logits.materialize(ctx, node)
    tv = targets.materialize(ctx, node)
    if tuple(lv.shape[:-1]) != tuple(tv.shape):
        fail(node, f"cross entropy of logits {list(lv.shape)} and targets {list(tv.shape)}")
    return Tensor(ctx.b.op("mapp.cross_entropy", [lv, tv], (), lv.elem,
                           {"ignore_index": ir.I64(ignore_index)}, module=ctx.module(node)))


# tanh gelu written out:
#   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
# Every stage before tanh emits its plain ops when used elsewhere (mapp has
# mul/scale/add); from tanh on, mapp has no op, so only the whole pattern
# exports.  Ops emitted for stages the pattern then consumed are dead and
# dropped by Builder.prune.

GELU_C = 0.044715
GELU_S = (2.0 / 3.141592653589793) ** 0.5


def _near(a, b):
    return abs(a - b) <= 1e-6 * abs(b)


class Cube(Pending):
    what = "x ** 3"

    def __init__(self, x):
        self.x, self.shape, self.elem = x, x.shape, x.elem

    def materialize(self, ctx, user):
        v = self.x.materialize(ctx, user)
        mod = user.meta.get("mapp_module", "")
        sq = ctx.b.op("mapp.mul", [v, v], v.shape, v.elem, module=mod)
        return ctx.b.op("mapp.mul", [sq, v], v.shape, v.elem, module=mod)


class GeluStage(Pending):
    """One stage of the tanh gelu of x: kind in cube_scaled (c*x^3), inner
    (x + c*x^3), inner_scaled (s*(x + c*x^3)), tanh, one_plus (1 + tanh),
    half_missing (x * (1 + tanh), the 0.5 still to come)."""

    def __init__(self, kind, x, c=None, s=None, plain=None):
        self.kind, self.x, self.c, self.s, self.plain = kind, x, c, s, plain
        self.shape, self.elem = x.shape, x.elem
        self.what = f"part of a tanh gelu ({kind})" + (
            "; mapp has tanh only inside 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))"
            if kind in ("tanh", "one_plus", "half_missing") else "")

    def materialize(self, ctx, user):
        if self.plain is None:
            return Pending.materialize(self, ctx, user)
        return self.plain(ctx, user)

    def is_tanh_gelu(self):
        return self.c is not None and self.s is not None and _near(self.c, GELU_C) \
            and _near(self.s, GELU_S)

"""Lowering of the rest of the tensor algebra (algebra.py): elementwise
math, comparisons, clamps, index_select, var, repeat_interleave.  A mixin of
lower.Lowering: each aten op maps to algebra ops or layout steps, with no
pattern recognition."""

import math

import torch

from . import algebra as alg
from . import ir
from .values import Const, Step, Tensor, Tuple, Unused, fail, node_meta, node_shape


class AlgebraLowering:
    def op_exp(self, node, x):
        return alg.unary(self, node, "mapp.exp", x)

    def op_log(self, node, x):
        return alg.unary(self, node, "mapp.log", x)

    def op_sqrt(self, node, x):
        return alg.unary(self, node, "mapp.sqrt", x)

    def op_sin(self, node, x):
        return alg.unary(self, node, "mapp.sin", x)

    def op_cos(self, node, x):
        return alg.unary(self, node, "mapp.cos", x)

    def op_sigmoid(self, node, x):
        return alg.unary(self, node, "mapp.sigmoid", x)

    def op_abs(self, node, x):
        return alg.unary(self, node, "mapp.abs", x)

    def op_sign(self, node, x):
        return alg.unary(self, node, "mapp.sign", x)

    def op_reciprocal(self, node, x):
        return alg.elementwise(self, node, "mapp.div", 1.0, x)

    def op_maximum(self, node, a, b):
        return alg.elementwise(self, node, "mapp.maximum", a, b)

    def op_minimum(self, node, a, b):
        return alg.elementwise(self, node, "mapp.minimum", a, b)

    # torch.max / min: of two tensors elementwise; of one, over all dims or
    # over `dim` with the indices beside the values (only the values lower:
    # a use of the indices is refused by name). The gradient is amax's
    # (shared among tied maxima; torch.max(x, dim) gives it to one).
    def op_max(self, node, x, other=None, keepdim=False):
        return self._extremum(node, x, other, keepdim, alg.reduce_max, "mapp.maximum", "max")

    def op_min(self, node, x, other=None, keepdim=False):
        return self._extremum(node, x, other, keepdim, alg.reduce_min, "mapp.minimum", "min")

    def _extremum(self, node, x, other, keepdim, reduce, elementwise, what):
        if other is None:
            return reduce(self, node, x, None, False)
        if not isinstance(other, int):
            return alg.elementwise(self, node, elementwise, x, other)
        return Tuple([reduce(self, node, x, [other], keepdim),
                      Unused(f"the indices of torch.{what}(x, dim) (arg{what})")])

    def op_amax(self, node, x, dim=(), keepdim=False):
        return alg.reduce_max(self, node, x, list(dim) or None, keepdim)

    def op_amin(self, node, x, dim=(), keepdim=False):
        return alg.reduce_min(self, node, x, list(dim) or None, keepdim)

    def op_logsumexp(self, node, x, dim, keepdim=False):
        # As torch's decomposition: shifted by the max, where it is finite
        # (a row of -inf gives -inf, not NaN).
        m = alg.reduce_max(self, node, x, list(dim), True)
        inf = alg.elementwise(self, node, "mapp.eq",
                              alg.unary(self, node, "mapp.abs", m), float("inf"))
        m = alg.select(self, node, inf, 0.0, m)
        e = alg.unary(self, node, "mapp.exp", alg.elementwise(self, node, "mapp.sub", x, m))
        y = alg.elementwise(self, node, "mapp.add",
                            alg.unary(self, node, "mapp.log",
                                      alg.reduce_sum(self, node, e, list(dim), True)), m)
        return y if keepdim else self._layout(node, y, Step("reshape", node_shape(node), node))

    def op_clamp(self, node, x, lo=None, hi=None):
        y = x if lo is None else alg.elementwise(self, node, "mapp.maximum", x, lo)
        return y if hi is None else alg.elementwise(self, node, "mapp.minimum", y, hi)

    def op_clamp_min(self, node, x, lo):
        return self.op_clamp(node, x, lo, None)

    def op_clamp_max(self, node, x, hi):
        return self.op_clamp(node, x, None, hi)

    def op_lt(self, node, a, b):
        return alg.elementwise(self, node, "mapp.lt", a, b)

    def op_le(self, node, a, b):
        return alg.elementwise(self, node, "mapp.le", a, b)

    def op_gt(self, node, a, b):
        return alg.elementwise(self, node, "mapp.gt", a, b)

    def op_ge(self, node, a, b):
        return alg.elementwise(self, node, "mapp.ge", a, b)

    def op_eq(self, node, a, b):
        return alg.elementwise(self, node, "mapp.eq", a, b)

    def op_ne(self, node, a, b):
        return alg.elementwise(self, node, "mapp.ne", a, b)

    def op_logical_not(self, node, x):
        return alg.elementwise(self, node, "mapp.sub", 1.0, x)

    op_bitwise_not = op_logical_not

    def op_stack(self, node, xs, dim=0):
        return alg.stack(self, node, xs, dim)

    def op_empty(self, node, size, **kw):
        # Uninitialized memory: only defined once filled (fill_ then folds
        # it, as repeat_interleave's index tensor); zeros stand in for it.
        return Const(torch.zeros(node_shape(node), dtype=node_meta(node).dtype))

    def op_index_select(self, node, x, dim, index):
        if not isinstance(index, Const):
            fail(node, "index_select with indices computed from the input (mapp takes "
                       "constant indices only)")
        dim %= len(x.shape)
        idx = index.val.reshape(-1).long()
        n = x.shape[dim]
        if idx.numel() and (idx.min() < 0 or idx.max() >= n):
            fail(node, f"index_select: an index is out of range for a dim of {n}")
        r = idx.numel() // n if n else 0
        shape = tuple(x.shape)
        if r and torch.equal(idx, torch.arange(n).repeat_interleave(r)):  # repeat_interleave
            y = self._layout(node, x, Step("reshape", shape[:dim + 1] + (1,) + shape[dim + 1:], node))
            y = self._layout(node, y, Step("expand", shape[:dim + 1] + (r,) + shape[dim + 1:], node))
            return self._layout(node, y, Step("reshape", node_shape(node), node))
        # Any other constant index list: runs of consecutive indices are
        # slices, concatenated.
        runs, start = [], 0
        for i in range(1, idx.numel() + 1):
            if i == idx.numel() or idx[i] != idx[i - 1] + 1:
                runs.append((int(idx[start]), int(idx[i - 1]) + 1))
                start = i
        parts = []
        for lo, hi in runs:
            part = list(shape)
            part[dim] = hi - lo
            parts.append(self._layout(node, x, Step("slice", tuple(part), node, dim=dim,
                                                    start=lo, end=hi)))
        if len(parts) == 1:
            return parts[0]
        vals = [p.materialize(self, node) for p in parts]
        return Tensor(self.b.op("mapp.concat", vals, node_shape(node), vals[0].elem,
                                {"dim": ir.I64(dim)}, module=self.module(node)))

    def op_relu(self, node, x):
        return alg.elementwise(self, node, "mapp.maximum", x, 0.0)

    def op_var(self, node, x, dims=None, *rest, **kw):
        # var.dim(x, dims, unbiased, keepdim) / var.correction(x, dims, *,
        # correction, keepdim): mean((x − mean)²)·n/(n − correction).
        if node.target._overloadname == "correction":
            correction = kw.get("correction", 1)
            correction = 1 if correction is None else correction
            keepdim = kw.get("keepdim", False)
        else:
            unbiased = rest[0] if rest else kw.get("unbiased", True)
            keepdim = rest[1] if len(rest) > 1 else kw.get("keepdim", False)
            correction = 1 if unbiased else 0
        n = len(x.shape)
        dims = list(dims) if dims else list(range(n))
        count = math.prod(x.shape[d % n] for d in dims)
        centered = alg.elementwise(self, node, "mapp.sub", x, alg.mean(self, node, x, dims, True),
                                   shape=x.shape)
        sq = alg.elementwise(self, node, "mapp.mul", centered, centered)
        total = alg.reduce_sum(self, node, sq, dims, keepdim)
        return alg.scale(self, node, total, 1.0 / (count - correction))

    def op_repeat_interleave(self, node, x, repeats=None, dim=None, **kw):
        if not isinstance(repeats, int) or dim is None:
            fail(node, "repeat_interleave other than by an int along a dim")
        dim %= len(x.shape)
        shape = tuple(x.shape)
        y = self._layout(node, x, Step("reshape", shape[:dim + 1] + (1,) + shape[dim + 1:], node))
        y = self._layout(node, y, Step("expand", shape[:dim + 1] + (repeats,) + shape[dim + 1:], node))
        return self._layout(node, y, Step("reshape", node_shape(node), node))

"""aten fx graph -> mapp IR, by abstract interpretation.

Nodes are visited in order; each evaluates to an abstract value (values.py).
Layout ops stay lazy, constant-only subgraphs are folded to their traced
value, and multi-op patterns (linear, rms norm, attention, dropout, cross
entropy) are recognized stage by stage.  Anything else is an error that names
the aten op and the user's source line: nothing is dropped silently.
"""

import math
import operator

import torch

from . import algebra as alg
from . import attention as att
from . import complex_rotary as crot
from . import ir
from . import patterns as pat
from .lower_algebra import AlgebraLowering
from .lower_moe import MoeLowering
from .values import (Const, ExportError, Lazy, Param, Pending, Step, Tensor, Tuple, Unused, fail,
                     node_meta, node_shape)

aten = torch.ops.aten

# Ops that only copy or relabel a tensor.
_IDENTITY = {"clone", "contiguous", "alias", "detach", "lift_fresh_copy", "lift_fresh"}
_RESHAPES = {"view", "_unsafe_view", "_reshape_alias", "reshape", "unsqueeze", "squeeze",
             "flatten", "view_as", "reshape_as", "unflatten"}
# Ops whose result is not a function of their inputs: never constant-folded.
_NONDETERMINISTIC = {"empty", "empty_like", "rand", "rand_like", "randn", "randn_like",
                     "bernoulli", "bernoulli_", "normal", "randint", "randperm", "native_dropout"}


def _packet(node):
    t = node.target
    if t is operator.getitem:
        return "getitem"
    if isinstance(t, torch._ops.OpOverload):
        return t.overloadpacket.__name__
    return str(t)


def _is_float_elem(e):
    return e in ("f32", "f16", "bf16")


class Lowering(MoeLowering, AlgebraLowering):
    @classmethod
    def lowered_ops(cls):
        """Names (aten overload packets) of the ops this lowering takes as
        they are: the op_* handlers, identities and reshapes."""
        return {n[len("op_"):] for n in dir(cls) if n.startswith("op_")} | _IDENTITY | _RESHAPES

    def __init__(self, gm, builder, param_names, recognize=True):
        """recognize=False: no pattern recognition, every aten op lowers to
        its op of the tensor algebra (algebra.py)."""
        self.recognize = recognize
        self.gm = gm
        self.b = builder
        self.param_names = param_names
        self.env = {}
        self.memo = {}
        self._dropouts = 0

    # -- helpers used by patterns ------------------------------------------

    def module(self, node):
        return node.meta.get("mapp_module", "")

    def next_dropout_seed(self):
        self._dropouts += 1
        return self._dropouts - 1

    def emit(self, node, name, operands, shape, attrs=None, elem=None):
        vals = [o.materialize(self, node) for o in operands]
        elem = elem or (vals[0].elem if vals else "f32")
        return Tensor(self.b.op(name, vals, shape, elem, attrs, module=self.module(node)))

    # -- driver --------------------------------------------------------------

    def run(self, inputs):
        live = self._live()
        placeholders = iter(inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = next(placeholders)
            elif node.op == "output":
                return self._output(node)
            elif node in live:
                self.env[node] = self._visit(node)
        raise ExportError("traced graph has no output")

    def _live(self):
        live = set()
        for node in reversed(list(self.gm.graph.nodes)):
            if node.op == "output" or node in live:
                live.add(node)
                for a in node.all_input_nodes:
                    live.add(a)
        return live

    def _output(self, node):
        res = node.args[0]
        if isinstance(res, (list, tuple)):
            if len(res) != 1:
                fail(node, "forward must return the loss only (one scalar tensor)")
            res = res[0]
        val = self.env[res] if isinstance(res, torch.fx.Node) else None
        if val is None or val.shape != ():
            fail(res if isinstance(res, torch.fx.Node) else node,
                 "forward must return a scalar loss tensor")
        return val.materialize(self, res)

    def _arg(self, a):
        return torch.fx.node.map_arg(a, lambda n: self.env[n])

    def _visit(self, node):
        if node.op == "get_attr":
            t = getattr(self.gm, node.target)
            name = self.param_names.get(id(t))
            if name is not None:
                return Param(name, t.shape, ir.elem_type(t.dtype))
            return Const(t.detach().clone())
        if node.op != "call_function":
            fail(node, f"unsupported fx node kind {node.op}")
        args = self._arg(node.args)
        kwargs = self._arg(node.kwargs)
        packet = _packet(node)
        ins = [a for a in node.all_input_nodes]
        if packet not in _NONDETERMINISTIC and node_meta(node) is not None \
                and all(isinstance(self.env[n], Const) for n in ins):
            # Fold constant-only subgraphs (masks, rotary tables) by running them.
            cargs = torch.fx.node.map_arg(node.args, lambda n: self.env[n].val)
            ckwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n].val)
            return Const(node.target(*cargs, **ckwargs).detach().clone())
        handler = getattr(self, "op_" + packet, None)
        if handler is None:
            if packet in _IDENTITY:
                return args[0]
            if packet in _RESHAPES:
                return self._layout(node, args[0], Step("reshape", node_shape(node), node))
            fail(node, "unsupported operation: mapp has no lowering for it")
        return handler(node, *args, **kwargs)

    # -- layout ------------------------------------------------------------

    def _layout(self, node, x, step):
        if isinstance(x, Const):
            return Const(step.apply(x.val).clone())
        if isinstance(x, Pending):
            r = x.layout(step, node)
            if r is None:
                # Not (or no longer) the pattern: its generic ops, then the
                # layout change (a pattern value that has none says why).
                return Lazy.of(Tensor(x.materialize(self, node))).then(step)
            return r
        if isinstance(x, (Tensor, Param, Lazy)):
            return Lazy.of(x).then(step)
        fail(node, "unsupported operand")

    def op_transpose(self, node, x, d0, d1):
        n = len(x.shape)
        perm = list(range(n))
        perm[d0 % n], perm[d1 % n] = perm[d1 % n], perm[d0 % n]
        return self._layout(node, x, Step("transpose", node_shape(node), node, perm=tuple(perm)))

    def op_t(self, node, x):
        return self.op_transpose(node, x, 0, 1) if len(x.shape) == 2 else x

    def op_permute(self, node, x, perm):
        n = len(x.shape)
        return self._layout(node, x, Step("transpose", node_shape(node), node,
                                          perm=tuple(p % n for p in perm)))

    def op_expand(self, node, x, size, implicit=False):
        return self._layout(node, x, Step("expand", node_shape(node), node))

    def op_slice(self, node, x, dim=0, start=None, end=None, step=1):
        dim %= len(x.shape)
        n = x.shape[dim]
        start = 0 if start is None else (start + n if start < 0 else start)
        end = n if end is None else (end + n if end < 0 else end)
        start, end = min(max(start, 0), n), min(max(end, start), n)
        if step == 1:
            return self._layout(node, x, Step("slice", node_shape(node), node,
                                              dim=dim, start=start, end=end))
        # x[start:end:step]: the dim seen as [n/step, step] (cut to whole
        # strides first where step does not divide it): rows
        # [start//step, +k) of column start % step.
        k = -(-(end - start) // step)
        r0, c = start // step, start % step
        m = -(-n // step)
        shape = list(x.shape)
        y = x
        if m * step != n:
            m = n // step
            if r0 + k > m:
                fail(node, f"strided slice {start}:{end}:{step} of a dim of {n} whose last "
                           "element lies past the last whole stride")
            shape[dim] = m * step
            y = self._layout(node, y, Step("slice", tuple(shape), node, dim=dim, start=0,
                                           end=m * step))
        y = self._layout(node, y, Step("reshape", tuple(shape[:dim] + [m, step] + shape[dim + 1:]),
                                       node))
        y = self._layout(node, y, Step("slice", tuple(shape[:dim] + [k, step] + shape[dim + 1:]),
                                       node, dim=dim, start=r0, end=r0 + k))
        y = self._layout(node, y, Step("slice", tuple(shape[:dim] + [k, 1] + shape[dim + 1:]),
                                       node, dim=dim + 1, start=c, end=c + 1))
        return self._layout(node, y, Step("reshape", node_shape(node), node))

    def op_select(self, node, x, dim, index):
        n = x.shape[dim % len(x.shape)]
        index = index + n if index < 0 else index
        shape = list(x.shape)
        shape[dim % len(shape)] = 1
        y = self._layout(node, x, Step("slice", tuple(shape), node, dim=dim % len(shape),
                                       start=index, end=index + 1))
        return self._layout(node, y, Step("reshape", node_shape(node), node))

    def _split(self, node, x, sizes, dim):
        dim %= len(x.shape)
        out, start = [], 0
        for s in sizes:
            shape = list(x.shape)
            shape[dim] = s
            out.append(self._layout(node, x, Step("slice", tuple(shape), node,
                                                  dim=dim, start=start, end=start + s)))
            start += s
        return Tuple(out)

    def op_split(self, node, x, size, dim=0):
        n = x.shape[dim % len(x.shape)]
        return self._split(node, x, [min(size, n - i) for i in range(0, n, size)], dim)

    def op_split_with_sizes(self, node, x, sizes, dim=0):
        return self._split(node, x, sizes, dim)

    def op_unbind(self, node, x, dim=0):
        dim %= len(x.shape)
        shape = x.shape[:dim] + x.shape[dim + 1:]
        out = []
        for i in range(x.shape[dim]):
            part = list(x.shape)
            part[dim] = 1
            y = self._layout(node, x, Step("slice", tuple(part), node, dim=dim, start=i, end=i + 1))
            out.append(self._layout(node, y, Step("reshape", shape, node)))
        return Tuple(out)

    def op_getitem(self, node, x, i):
        if not isinstance(x, Tuple):
            fail(node, "indexing a non-tuple value")
        return x.items[i]

    def op__to_copy(self, node, x, dtype=None, **kw):
        to = node_meta(node).dtype
        if dtype is None or ir.elem_type(to) == x.elem:
            return x
        if not to.is_floating_point and x.elem in ("i32", "i64"):
            return x  # targets.long(): mapp keeps token ids and targets in i32
        if to == torch.float32 and x.elem in ("f32", "i1"):
            return x  # booleans are 0/1 floats in mapp already
        if to == torch.float32 and x.elem in ("i32", "i64"):
            return self.emit(node, "mapp.cast", [x], x.shape, elem="f32")
        fail(node, f"casts {x.elem} to {ir.elem_type(to)}; the exporter handles fp32 only")

    # -- compute -------------------------------------------------------------

    def op_embedding(self, node, table, ids, padding_idx=-1, *rest):
        shape = node_shape(node)
        if isinstance(ids, Const):
            # Position ids from torch.arange: rows start..start+n of the table.
            flat = ids.val.reshape(-1).long()
            n = flat.numel()
            if n == 0 or not torch.equal(flat, torch.arange(n) + flat[0]) \
                    or flat[0] < 0 or flat[0] + n > table.shape[0]:
                fail(node, "embedding of constant ids other than a range (torch.arange)")
            start = int(flat[0])
            rows = self._layout(node, table, Step("slice", (n,) + table.shape[1:], node,
                                                  dim=0, start=start, end=start + n))
            return self._layout(node, rows, Step("reshape", shape, node))
        return self.emit(node, "mapp.embedding", [table, ids], shape, elem=table.elem)

    def op_native_layer_norm(self, node, x, normalized_shape, w, b, eps):
        if list(normalized_shape) != [x.shape[-1]]:
            fail(node, "layer norm over more than the last dimension")
        h = x.shape[-1]
        base = x.leading_reshape(True) if isinstance(x, Lazy) else None
        src = base if base is not None else x
        w = w if w is not None else Const(torch.ones(h))
        b = b if b is not None else Const(torch.zeros(h))
        y = self.emit(node, "mapp.layer_norm", [src, w, b], src.shape, {"eps": ir.F64(eps)})
        if base is not None:
            y = Lazy.of(y).then(Step("reshape", x.shape, node))
        return Tuple([y, Unused("layer norm mean"), Unused("layer norm rstd")])

    def _linear(self, node, x, wt, bias):
        """x @ w.t() (+ bias) with w [N,K] -> mapp.linear, else None."""
        if not (isinstance(wt, Lazy) and len(wt.steps) == 1 and wt.steps[0].kind == "transpose"
                and len(wt.shape) == 2):
            return None
        w = wt.base
        base = x.leading_reshape(True) if isinstance(x, Lazy) else None
        src = base if base is not None else x
        ops = [src, w] + ([bias] if bias is not None else [])
        if bias is not None and bias.shape != (w.shape[0],):
            return None
        y = self.emit(node, "mapp.linear", ops, src.shape[:-1] + (w.shape[0],))
        return Lazy.of(y).then(Step("reshape", node_shape(node), node)) if base is not None else y

    def op_addmm(self, node, bias, x, wt, beta=1, alpha=1):
        if beta != 1 or alpha != 1:
            fail(node, "addmm with alpha/beta other than 1")
        y = self._linear(node, x, wt, bias)
        if y is None:
            y = self.emit(node, "mapp.matmul", [x, wt], node_shape(node))
            y = self._binary(node, "mapp.add", y, bias)
        return y

    def op_mm(self, node, x, w):
        y = self._linear(node, x, w, None)
        return y if y is not None else self.emit(node, "mapp.matmul", [x, w], node_shape(node))

    def op_bmm(self, node, a, b):
        if not self.recognize:
            return self.emit(node, "mapp.matmul", [a, b], node_shape(node))
        if isinstance(a, att.Probs):
            y = att.attention(self, node, a, b)
            if y is not None:
                return y
        elif att.scores_operands(a, b):
            return att.Scores(a, b, node_shape(node), node)
        return self.emit(node, "mapp.matmul", [a, b], node_shape(node))

    def op_masked_fill(self, node, x, mask, value):
        if isinstance(value, Const) and value.shape == ():
            value = value.uniform()
        if isinstance(x, att.Scores) and isinstance(mask, Const) and not x.causal \
                and isinstance(value, (int, float)) \
                and att.is_causal_mask(mask, x.shape[-1], float(value)):
            return x.copy(causal=True)
        return alg.select(self, node, mask, value, x)

    def op_where(self, node, cond, a, b=None):
        # torch.where(tril_mask, scores, fill) == scores.masked_fill(~tril_mask, fill)
        if isinstance(cond, Const) and cond.val.dtype == torch.bool and isinstance(a, att.Scores):
            return self.op_masked_fill(node, a, Const(~cond.val), b)
        if b is None:
            fail(node, "torch.where(cond) (the indices form) has data-dependent shape")
        return alg.select(self, node, cond, a, b)

    def op__softmax(self, node, x, dim, half_to_float=False):
        if dim % len(x.shape) != len(x.shape) - 1:
            fail(node, "softmax over a dimension other than the last")
        if isinstance(x, att.Scores):
            return att.Probs(x, x.shape)
        return self._rowwise(node, "mapp.softmax", x, keep_last=True)

    def op__log_softmax(self, node, x, dim, half_to_float=False):
        if dim % len(x.shape) != len(x.shape) - 1:
            fail(node, "log_softmax over a dimension other than the last")
        return pat.LogSoftmax(x)

    def op_nll_loss_forward(self, node, x, target, weight, reduction, ignore_index):
        if not isinstance(x, pat.LogSoftmax) or weight is not None:
            fail(node, "nll_loss is only supported as cross_entropy (after log_softmax, no weight)")
        return Tuple([pat.cross_entropy(self, node, x, target, reduction, ignore_index),
                      Unused("nll_loss total weight")])

    # torch >= 2.0: F.scaled_dot_product_attention, as traced on CPU.
    def op_scaled_dot_product_attention(self, node, q, k, v, attn_mask=None, dropout_p=0.0,
                                        is_causal=False, scale=None, **kw):
        return att.sdpa(self, node, q, k, v, attn_mask, dropout_p, is_causal, scale)

    def op__scaled_dot_product_flash_attention_for_cpu(self, node, q, k, v, dropout_p=0.0,
                                                       is_causal=False, attn_mask=None,
                                                       scale=None, **kw):
        y = att.sdpa(self, node, q, k, v, attn_mask, dropout_p, is_causal, scale)
        return Tuple([y, Unused("attention logsumexp")])

    def op__scaled_dot_product_flash_attention(self, node, q, k, v, dropout_p=0.0,
                                               is_causal=False, return_debug_mask=False,
                                               scale=None, **kw):
        y = att.sdpa(self, node, q, k, v, None, dropout_p, is_causal, scale)
        return Tuple([y] + [Unused("flash attention statistics")] * 8)

    def op__scaled_dot_product_efficient_attention(self, node, q, k, v, attn_bias=None,
                                                   compute_log_sumexp=False, dropout_p=0.0,
                                                   is_causal=False, scale=None, **kw):
        y = att.sdpa(self, node, q, k, v, attn_bias, dropout_p, is_causal, scale)
        return Tuple([y] + [Unused("efficient attention statistics")] * 3)

    def op_gelu(self, node, x, approximate="none"):
        return self._rowwise(node, "mapp.gelu", x, {"approximate": approximate})

    def op_silu(self, node, x):
        return self._rowwise(node, "mapp.silu", x)

    def _rowwise(self, node, name, x, attrs=None, keep_last=False):
        """Elementwise (or last-dim) op; runs on the original of a reshape."""
        base = x.leading_reshape(keep_last) if isinstance(x, Lazy) else None
        src = base if base is not None else x
        y = self.emit(node, name, [src], src.shape, attrs)
        return Lazy.of(y).then(Step("reshape", x.shape, node)) if base is not None else y

    # -- arithmetic (with the pattern stages they can complete) -------------

    def _scalar(self, node, x, factor):
        if not self.recognize:
            return alg.scale(self, node, x, factor) if factor != 1 else x
        if isinstance(x, att.Scores) and factor > 0:
            return x.copy(scale=x.scale * factor)
        if isinstance(x, (pat.Cube, pat.GeluStage)):
            g = self._gelu_scalar(node, x, factor)
            if g is not None:
                return g
        if factor == 1:
            return x
        y = self._rowwise(node, "mapp.scale", x, {"factor": ir.F64(factor)})
        y.scaled_from = (x, factor)  # for 0.5 * x * (1 + tanh(...))
        return y

    def _plain_scale(self, x, factor, node):
        return lambda ctx, user: self._rowwise(node, "mapp.scale", x, {"factor": ir.F64(factor)}) \
            .materialize(ctx, user)

    def _gelu_scalar(self, node, x, factor):
        if isinstance(x, pat.Cube):
            return pat.GeluStage("cube_scaled", x.x, c=factor, plain=self._plain_scale(x, factor, node))
        if x.kind == "inner":
            return pat.GeluStage("inner_scaled", x.x, c=x.c, s=factor,
                                 plain=self._plain_scale(x, factor, node))
        if x.kind == "half_missing" and factor == 0.5 and x.is_tanh_gelu():
            return self._rowwise(node, "mapp.gelu", x.x, {"approximate": "tanh"})
        return None

    def _gelu_binary(self, node, name, a, b):
        """The tanh-gelu stages completed by an add or mul, else None."""
        for x, y in ((a, b), (b, a)):
            if not isinstance(x, pat.GeluStage):
                continue
            if name == "add" and x.kind == "cube_scaled" and _same_value(y, x.x):
                return pat.GeluStage("inner", x.x, c=x.c, plain=lambda ctx, user, a=a, b=b:
                                     self._binary(node, "mapp.add", a, b).materialize(ctx, user))
            if name == "add" and x.kind == "tanh" and isinstance(y, (int, float)) and y == 1:
                return pat.GeluStage("one_plus", x.x, c=x.c, s=x.s, plain=lambda ctx, user, a=a, b=b:
                                     alg.elementwise(self, node, "mapp.add", a, b)
                                     .materialize(ctx, user))
            if name == "mul" and x.kind == "one_plus" and x.is_tanh_gelu():
                src = getattr(y, "scaled_from", None)
                if src is not None and src[1] == 0.5 and _same_value(src[0], x.x):
                    return self._rowwise(node, "mapp.gelu", x.x, {"approximate": "tanh"})
                if _same_value(y, x.x):
                    return pat.GeluStage("half_missing", x.x, c=x.c, s=x.s,
                                         plain=lambda ctx, user, a=a, b=b:
                                         alg.elementwise(self, node, "mapp.mul", a, b)
                                         .materialize(ctx, user))
        return None

    def op_tanh(self, node, x):
        if isinstance(x, pat.GeluStage) and x.kind == "inner_scaled":
            return pat.GeluStage("tanh", x.x, c=x.c, s=x.s, plain=lambda ctx, user:
                                 alg.unary(self, node, "mapp.tanh", x).materialize(ctx, user))
        return alg.unary(self, node, "mapp.tanh", x)

    def _binary(self, node, name, a, b):
        """mapp.add / mapp.mul with the trailing-broadcast rule."""
        if not isinstance(b, torch.fx.Node) and isinstance(b, (int, float)):
            b = Const(torch.tensor(float(b)))
        av, bv = a.materialize(self, node), b.materialize(self, node)
        if len(av.shape) < len(bv.shape) or (len(av.shape) == len(bv.shape) and av.shape != bv.shape
                                             and math.prod(av.shape) < math.prod(bv.shape)):
            av, bv = bv, av
        trimmed = tuple(bv.shape)
        while trimmed and trimmed[0] == 1 and len(trimmed) > 0 and trimmed != av.shape[-len(trimmed):]:
            trimmed = trimmed[1:]
        if trimmed != tuple(av.shape[len(av.shape) - len(trimmed):]) \
                or tuple(av.shape) != alg.result_shape(node, av, bv):
            # Not the add/mul suffix rule: broadcast both explicitly.
            shape = alg.result_shape(node, av, bv)
            return Tensor(self.b.op(name, [alg.broadcast(self, node, av, shape),
                                           alg.broadcast(self, node, bv, shape)],
                                    shape, av.elem, module=self.module(node)))
        if trimmed != bv.shape:
            bv = self.b.op("mapp.reshape", [bv], trimmed, bv.elem, module=self.module(node))
        return Tensor(self.b.op(name, [av, bv], av.shape, av.elem, module=self.module(node)))

    def op_mul(self, node, a, b):
        if not self.recognize:
            if any(isinstance(x, alg.Complex) or (isinstance(x, Const) and x.val.is_complex())
                   for x in (a, b)):
                return alg.complex_mul(self, node, a, b)
            if isinstance(b, (int, float)):
                return self._scalar(node, a, float(b))
            if isinstance(a, (int, float)):
                return self._scalar(node, b, float(a))
            return self._binary(node, "mapp.mul", a, b)
        c = crot.multiply(node, a, b, node_shape(node))
        if c is not None:
            return c
        if isinstance(b, (int, float)) and not isinstance(a, (int, float)):
            return self._scalar(node, a, float(b))
        if isinstance(a, (int, float)):
            return self._scalar(node, b, float(a))
        g = self._gelu_binary(node, "mul", a, b)
        if g is not None:
            return g
        if _same_value(a, b) and isinstance(a, (Lazy, Tensor, Param)):
            return pat.Square(a)  # x * x of an rms norm (or a plain product)
        for x, y in ((a, b), (b, a)):
            if isinstance(y, pat.InvRms) and x.shape == y.x.shape and _same_value(x, y.x):
                return pat.Normalized(y.x, y.eps)
            if isinstance(x, pat.Normalized) and isinstance(y, (Param, Tensor)) \
                    and y.shape == (x.shape[-1],):
                return self.emit(node, "mapp.rms_norm", [x.x, y], x.shape, {"eps": ir.F64(x.eps)})
            if isinstance(y, pat.KeepMask) and y.scaled:
                # p comes back as 1 - (1 - p): round off the last-ulp error
                # so p = 0.1 reads 0.1 as in the config.
                return pat.dropout(self, node, x, float(f"{1.0 - y.keep:.15g}"))
            if isinstance(y, Const) and y.uniform() is None and isinstance(x, (Lazy, att.RotateHalf)):
                return att.TimesTable(x, y, node)
        if isinstance(a, Const) and a.uniform() is not None and a.shape == ():
            return self._scalar(node, b, a.uniform())
        if isinstance(b, Const) and b.uniform() is not None and b.shape == ():
            return self._scalar(node, a, b.uniform())
        return self._binary(node, "mapp.mul", a, b)

    def op_view_as_complex(self, node, x):
        if not self.recognize:
            return alg.complex_of(self, node, x)
        return crot.view_as_complex(node, x)

    def op_view_as_real(self, node, z):
        if not self.recognize:
            if not isinstance(z, alg.Complex):
                fail(node, "view_as_real of a tensor that is not complex")
            return alg.view_as_real(self, node, z)
        return crot.view_as_real(node, z)

    def op_div(self, node, a, b):
        if isinstance(a, pat.KeepMask) and not a.scaled and isinstance(b, (int, float)) \
                and abs(b - a.keep) < 1e-12:
            return pat.KeepMask(a.keep, a.shape, scaled=True)
        if isinstance(b, Const) and b.shape == () and b.uniform() is not None:
            b = float(b.uniform())
        if isinstance(b, (int, float)):
            return self._scalar(node, a, 1.0 / float(b))
        return alg.elementwise(self, node, "mapp.div", a, b)

    op_div_ = op_div

    def op_add(self, node, a, b, alpha=1):
        if alpha != 1:
            fail(node, "add with alpha other than 1")
        if not self.recognize:
            return self._binary(node, "mapp.add", a, b)
        if isinstance(a, pat.MeanSquare) and isinstance(b, (int, float)):
            return pat.MeanSquareEps(a.x, float(b), a.shape)
        r = att.rotary(node, a, b)
        if r is not None:
            return r
        g = self._gelu_binary(node, "add", a, b)
        if g is not None:
            return g
        for x, y in ((a, b), (b, a)):
            if isinstance(x, att.Scores) and isinstance(y, Const) and not x.causal \
                    and att.is_causal_mask(y, x.shape[-1], None):
                return x.copy(causal=True)
        return self._binary(node, "mapp.add", a, b)

    def op_sub(self, node, a, b, alpha=1):
        if alpha != 1:
            fail(node, "sub with alpha other than 1")
        if isinstance(b, (int, float)):
            return self._binary(node, "mapp.add", a, -float(b))
        return alg.elementwise(self, node, "mapp.sub", a, b)

    def op_rsub(self, node, a, b, alpha=1):
        if alpha != 1:
            fail(node, "rsub with alpha other than 1")
        return alg.elementwise(self, node, "mapp.sub", b, a)

    def op_neg(self, node, x):
        if not self.recognize:
            return alg.unary(self, node, "mapp.neg", x)
        return att.Negated(x, node)

    def op_cat(self, node, xs, dim=0):
        r = att.rotate_half(node, xs, dim) if self.recognize else None
        if r is not None:
            return r
        vals = [x.materialize(self, node) for x in xs]
        return Tensor(self.b.op("mapp.concat", vals, node_shape(node), vals[0].elem,
                                {"dim": ir.I64(dim % len(vals[0].shape))}, module=self.module(node)))

    def op_pow(self, node, x, e):
        if not isinstance(e, (int, float)):
            fail(node, "pow with a tensor exponent (mapp.pow takes a constant exponent)")
        if isinstance(x, (int, float)):
            fail(node, "pow of a number by a tensor")
        if self.recognize and e == 2:
            return pat.Square(x)
        if self.recognize and e == 3:
            return pat.Cube(x)
        return alg.unary(self, node, "mapp.pow", x, {"exponent": ir.F64(float(e))})

    def op_mean(self, node, x, dims=None, keepdim=False, dtype=None):
        if self.recognize and isinstance(x, pat.Square) and dims \
                and [d % len(x.shape) for d in dims] == [len(x.shape) - 1] and keepdim:
            return pat.MeanSquare(x.x, node_shape(node))
        y = self._reduce(node, x, dims, keepdim)
        count = math.prod(x.shape[d % len(x.shape)] for d in (dims or range(len(x.shape))))
        return self._scalar(node, y, 1.0 / count)

    def op_sum(self, node, x, dims=None, keepdim=False, dtype=None):
        return self._reduce(node, x, dims, keepdim)

    def _reduce(self, node, x, dims, keepdim):
        n = len(x.shape)
        dims = sorted({d % n for d in (dims if dims else range(n))})
        v = x.materialize(self, node)
        shape = tuple(s for i, s in enumerate(v.shape) if i not in dims)
        y = self.b.op("mapp.reduce_sum", [v], shape, v.elem, {"dims": ir.Array(dims)},
                      module=self.module(node))
        if keepdim:
            y = self.b.op("mapp.reshape", [y], node_shape(node), y.elem, module=self.module(node))
        return Tensor(y)

    def op_rsqrt(self, node, x):
        if self.recognize and isinstance(x, pat.MeanSquareEps):
            return pat.InvRms(x.x, x.eps, x.shape)
        return alg.unary(self, node, "mapp.rsqrt", x)

    # -- dropout (CPU form) ------------------------------------------------

    def op_empty_like(self, node, x, **kw):
        return pat.MaskBuffer(x.shape)

    def op_bernoulli_(self, node, x, p=0.5, **kw):
        if isinstance(x, pat.MaskBuffer) and isinstance(p, float):
            return pat.KeepMask(p, x.shape)
        fail(node, "random numbers are only supported as a dropout mask")

    op_bernoulli = op_bernoulli_

    def op_native_dropout(self, node, x, p, train):
        if not train or p == 0:
            return Tuple([x, Unused("dropout mask")])
        return Tuple([pat.dropout(self, node, x, p), Unused("dropout mask")])


def _same_value(a, b):
    if a is b:
        return True
    if isinstance(a, Lazy) and isinstance(b, Lazy):
        return a.base is b.base and [s.key() for s in a.steps] == [s.key() for s in b.steps]
    return False

"""Abstract values of the aten -> mapp lowering (see lower.py).

Each fx node evaluates to one of these.  `Tensor` and `Param` are real mapp
values; `Lazy` is a not-yet-emitted layout change (view/transpose/slice) of
one, kept lazy so chains like view->transpose->view cancel out and so patterns
(attention) can inspect the element arrangement; `Const` is a tensor computed
from constants only (masks, rotary tables), kept by value for pattern checks.
Pattern pieces (attention scores, rms-norm stages, ...) live next to their
patterns and subclass `Pending`.
"""

import math

import torch

from . import ir


class ExportError(Exception):
    pass


def node_op(node):
    """The node's aten op, and the op the user wrote where torch decomposed
    that one into this (torch >= 2 records it as meta["original_aten"])."""
    t = node.target
    op = str(t) if not isinstance(t, str) else t
    orig = node.meta.get("original_aten")
    return op if orig is None or str(orig) == op else f"{op} (decomposed from {orig})"


def node_where(node):
    src = node.meta.get("mapp_source", "<unknown source>")
    mod = node.meta.get("mapp_module")
    return f"{src}" + (f" (module '{mod}')" if mod else "")


def node_meta(node):
    """TensorMetadata (shape, dtype) of a node's single tensor result, or None
    (make_fx in real mode records metadata, not values)."""
    m = node.meta.get("tensor_meta")
    if m is None:
        m = node.meta.get("val")  # torch.export: a FakeTensor
    return m if m is not None and hasattr(m, "shape") and hasattr(m, "dtype") else None


def node_shape(node):
    m = node_meta(node)
    return tuple(m.shape) if m is not None else None


def fail(node, message):
    raise ExportError(f"{node_where(node)}: {node_op(node)}: {message}")


class Abstract:
    shape = ()
    elem = "f32"

    def materialize(self, ctx, user):
        """Emit (if needed) and return the ir.Value; `user` is the fx node
        that needs it (named in errors)."""
        raise NotImplementedError


class Tensor(Abstract):
    def __init__(self, value):
        self.value = value
        self.shape = value.shape
        self.elem = value.elem

    def materialize(self, ctx, user):
        return self.value


class Param(Abstract):
    def __init__(self, name, shape, elem):
        self.name, self.shape, self.elem = name, tuple(shape), elem

    def materialize(self, ctx, user):
        # One param_ref per use, right before its user: simple to mirror in
        # the config importer, and passes never need to look far for it.
        return ctx.b.param_ref(self.name, self.shape, self.elem)


class Const(Abstract):
    def __init__(self, val):
        self.val = val
        self.shape = tuple(val.shape)
        # Complex constants (rotary freqs_cis) exist only inside patterns.
        self.elem = "complex" if val.is_complex() else ir.elem_type(val.dtype)

    def uniform(self):
        """The single value of a constant whose elements are all equal, else None."""
        if self.val.numel() == 0:
            return None
        flat = self.val.reshape(-1)
        first = flat[0]
        return first.item() if bool((flat == first).all()) else None

    def materialize(self, ctx, user):
        if self.val.is_complex():
            fail(user, f"uses a complex constant of shape {list(self.shape)} where mapp needs "
                       "a real tensor")
        # Booleans (masks) become 0/1 floats, as mapp's comparisons give them;
        # integer constants (positions) become floats too.
        elem = self.elem if self.elem in ("f32", "f16", "bf16") else "f32"
        v = self.uniform()
        if v is not None:
            # Unnamed: a constant is no PyTorch value a probe would ask for.
            return ctx.b.op("mapp.fill", [], self.shape, elem, {"value": ir.F64(float(v))},
                            named=False)
        if elem != "f32":
            fail(user, f"uses a non-uniform {self.elem} constant; mapp.constant holds f32")
        # One mapp.constant per use, right before its user (as param_ref
        # and fill): a table shared by all layers must not become a value
        # that pipeline stages pass to each other.
        vals = self.val.detach().reshape(-1).to(torch.float32).tolist()
        return ctx.b.op("mapp.constant", [], self.shape, "f32",
                        {"value": ir.Dense(vals, self.shape)}, named=False)


class Pending(Abstract):
    """A partial pattern; using it outside its pattern is an error unless the
    subclass knows how to emit plain ops for it."""

    what = "a partial pattern"

    def materialize(self, ctx, user):
        fail(user, f"consumes {self.what} that mapp cannot express on its own "
                   "(the surrounding pattern was not completed)")

    def layout(self, step, node):
        return None


class Step:
    """One layout change: kind in reshape | transpose | slice | expand."""

    def __init__(self, kind, shape, node, **data):
        self.kind, self.shape, self.node, self.data = kind, tuple(shape), node, data

    def key(self):
        return (self.kind, self.shape, tuple(sorted(self.data.items())))

    def apply(self, t):
        if self.kind == "reshape":
            return t.reshape(self.shape)
        if self.kind == "transpose":
            return t.permute(self.data["perm"])
        if self.kind == "slice":
            d = self.data
            return t.narrow(d["dim"], d["start"], d["end"] - d["start"])
        return t.expand(self.shape)


class Lazy(Abstract):
    """base (Tensor | Param | Virtual) seen through `steps`."""

    def __init__(self, base, steps):
        self.base, self.steps = base, list(steps)
        self.shape = self.steps[-1].shape if self.steps else base.shape
        self.elem = base.elem
        self._idx = None

    @staticmethod
    def of(x):
        return x if isinstance(x, Lazy) else Lazy(x, [])

    def then(self, step):
        """This value followed by `step`, simplified; may return the base."""
        steps = _simplify(self.base.shape, self.steps + [step])
        if not steps and not isinstance(self.base, Virtual):
            return self.base
        return Lazy(self.base, steps)

    def idx(self, upto=None):
        """Flat base index of each element: how the steps rearrange the base."""
        steps = self.steps if upto is None else self.steps[:upto]
        t = torch.arange(math.prod(self.base.shape)).reshape(self.base.shape)
        for s in steps:
            t = s.apply(t)
        return t

    def prefix(self, k):
        return Lazy(self.base, self.steps[:k]) if k else self.base

    def leading_reshape(self, keep_last):
        """The base when this is just a reshape of it (that keeps the last
        dim, when keep_last): ops applied row-wise can run on the base."""
        if len(self.steps) == 1 and self.steps[0].kind == "reshape" and not isinstance(self.base, Virtual):
            if not keep_last or self.shape[-1:] == self.base.shape[-1:]:
                return self.base
        return None

    def materialize(self, ctx, user):
        key = (id(self.base), tuple(s.key() for s in self.steps))
        hit = ctx.memo.get(key)
        if hit is not None:
            return hit
        v = self.base.materialize(ctx, user)
        if v.elem not in ("f32", "f16", "bf16") and self.steps:
            fail(self.steps[0].node, f"changes the layout of an integer tensor ({v.elem}; e.g. "
                 "shifting labels inside forward): mapp layout ops are float-only, and "
                 "mapp-run already feeds next-token targets")
        for s in self.steps:
            mod = s.node.meta.get("mapp_module", "")
            d = s.data
            if s.kind == "reshape":
                v = ctx.b.op("mapp.reshape", [v], s.shape, v.elem, module=mod)
            elif s.kind == "transpose":
                v = ctx.b.op("mapp.transpose", [v], s.shape, v.elem,
                             {"perm": ir.Array(d["perm"])}, module=mod)
            elif s.kind == "slice":
                v = ctx.b.op("mapp.slice", [v], s.shape, v.elem,
                             {"dim": ir.I64(d["dim"]), "start": ir.I64(d["start"]),
                              "end": ir.I64(d["end"])}, module=mod)
            else:  # expand: NumPy broadcasting, mapp.broadcast
                v = ctx.b.op("mapp.broadcast", [v], s.shape, v.elem, module=mod)
        ctx.memo[key] = v
        return v


def _simplify(shape, steps):
    """Drops no-op steps and merges neighbours until nothing changes:
    same-shape reshape/expand/slice, reshape after reshape, transpose after
    transpose (composed), identity transpose."""
    changed = True
    while changed:
        changed = False
        out = []
        cur = tuple(shape)
        for s in steps:
            if s.kind in ("reshape", "expand", "slice") and s.shape == cur:
                changed = True
                continue
            if s.kind == "transpose" and tuple(s.data["perm"]) == tuple(range(len(cur))):
                changed = True
                continue
            prev = out[-1] if out else None
            if prev is not None and prev.kind == s.kind == "reshape":
                out[-1] = s
                changed = True
            elif prev is not None and prev.kind == s.kind == "transpose":
                p1, p2 = prev.data["perm"], s.data["perm"]
                out[-1] = Step("transpose", s.shape, s.node, perm=tuple(p1[i] for i in p2))
                changed = True
            else:
                out.append(s)
            cur = s.shape
        steps = out
        # Re-derive each step's input shape on the next pass.
    return steps


class Virtual(Abstract):
    """A stand-in base for layout changes applied to a pattern value."""

    def __init__(self, shape):
        self.shape = tuple(shape)


class Tuple(Abstract):
    def __init__(self, items):
        self.items = items


class Unused(Pending):
    def __init__(self, what):
        self.what = what

"""A tiny builder for mapp IR text (MLIR generic form for mapp ops).

Ops are buffered and printed at the end because their `mapp.name` depends on
every op emitted for the same module (see `assign_names`).  The attribute
spellings follow docs/semantics.md, "IR conventions".
"""

import math
import struct

_DTYPES = {
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.bool": "i1",
}


def elem_type(dtype):
    s = str(dtype)
    if s not in _DTYPES:
        raise ValueError(f"dtype {s} has no mapp element type")
    return _DTYPES[s]


def tensor_type(shape, elem):
    dims = "".join(f"{int(d)}x" for d in shape)
    return f"tensor<{dims}{elem}>"


class I64(int):
    """An attribute printed as `N : i64`."""


class F64(float):
    """An attribute printed as `X : f64`."""


class Unit:
    """A unit attribute (present means true)."""


class Array(tuple):
    """A dense i64 array attribute: array<i64: ...>."""


class SymRef(str):
    """A symbol reference attribute: @"name"."""


class Dense:
    """A dense f32 elements attribute (mapp.constant's value), printed in
    MLIR's hex form: the little-endian bytes, exact and compact."""

    def __init__(self, values, shape):
        self.values = [float(v) for v in values]
        self.shape = tuple(int(d) for d in shape)

    def text(self):
        raw = struct.pack(f"<{len(self.values)}f", *self.values)
        return f'dense<"0x{raw.hex().upper()}"> : {tensor_type(self.shape, "f32")}'


def format_f64(x):
    x = float(x)
    if math.isfinite(x):
        s = repr(x)
        if "e" in s and "." not in s.split("e")[0]:
            mant, exp = s.split("e")
            s = f"{mant}.0e{exp}"
        return s
    # MLIR spells non-finite floats as the hex bit pattern.
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", x))[0]


def _quote(s):
    out = []
    for ch in s:
        if ch in '"\\' or not 32 <= ord(ch) < 127:
            out.extend("\\%02X" % b for b in ch.encode())
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def format_attr(v):
    if isinstance(v, Unit):
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):  # I64 and plain ints (config values)
        return f"{int(v)} : i64"
    if isinstance(v, float):
        return f"{format_f64(v)} : f64"
    if isinstance(v, Array):
        return "array<i64" + ("" if not v else ": " + ", ".join(str(int(i)) for i in v)) + ">"
    if isinstance(v, SymRef):
        return "@" + _quote(v)
    if isinstance(v, Dense):
        return v.text()
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, dict):
        return "{" + ", ".join(_attr_entry(k, x) for k, x in v.items()) + "}"
    raise TypeError(f"cannot print attribute {v!r}")


def _attr_entry(key, value):
    text = format_attr(value)
    return key if text is None else f"{key} = {text}"


class Value:
    def __init__(self, ssa, shape, elem):
        self.ssa = ssa
        self.shape = tuple(int(d) for d in shape)
        self.elem = elem

    @property
    def type(self):
        return tensor_type(self.shape, self.elem)


class Op:
    def __init__(self, name, operands, attrs, result, module, kind, extra=()):
        self.name = name
        self.operands = operands
        self.attrs = attrs
        self.result = result
        self.results = [result, *extra]  # ops with several results (moe_router)
        self.module = module  # nn.Module path of the producing code
        self.kind = kind  # naming suffix, normally the op name without `mapp.`
        self.value_name = None


class Builder:
    def __init__(self):
        self.params = []  # (name, shape, elem)
        self.args = []  # Values
        self.ops = []
        self.model_attrs = None
        self._next = 0

    def arg(self, name, shape, elem):
        v = Value(f"%{name}", shape, elem)
        self.args.append(v)
        return v

    def param(self, name, shape, elem):
        self.params.append((name, tuple(shape), elem))

    @staticmethod
    def init_attrs(name, shape):
        """How the runtime initializes a parameter without a weights file:
        the reference rule (normal(0, 0.02) for matrices and embeddings,
        zeros for biases, ones for other vectors, i.e. norm weights)."""
        if len(shape) >= 2:
            return {"init": "normal", "std": F64(0.02)}
        return {"init": "zeros" if name.endswith(".bias") else "ones"}

    def op(self, name, operands, shape, elem, attrs=None, module="", kind=None, named=True):
        result = Value(f"%{self._next}", shape, elem)
        self._next += 1
        op = Op(name, list(operands), dict(attrs or {}), result, module,
                (kind or name.split(".", 1)[1]) if named else None)
        self.ops.append(op)
        return result

    def op_multi(self, name, operands, results, attrs=None, module=""):
        """An op with several results [(shape, elem), ...]: %N#0, %N#1, ..."""
        ssa = f"%{self._next}"
        self._next += 1
        values = [Value(f"{ssa}#{i}", shape, elem) for i, (shape, elem) in enumerate(results)]
        op = Op(name, list(operands), dict(attrs or {}), values[0], module,
                name.split(".", 1)[1], values[1:])
        op.ssa = ssa
        self.ops.append(op)
        return values

    def param_ref(self, name, shape, elem):
        return self.op("mapp.param_ref", [], shape, elem, {"param": SymRef(name)}, named=False)

    def prune(self, result):
        """Drops ops whose value nothing uses: multi-op patterns (tanh gelu)
        are recognized after their first ops were emitted."""
        used = {id(result)}
        kept = []
        for op in reversed(self.ops):
            if any(id(r) in used for r in op.results):
                kept.append(op)
                used.update(id(v) for v in op.operands)
        self.ops = kept[::-1]

    def assign_names(self, leaf_modules):
        """mapp.name: the module path when the op is the only op of a leaf
        module (nn.Linear -> "layers.0.attn.qkv"); otherwise path + "." +
        kind, with "_1", "_2", ... for repeats within the same module
        ("layers.0.add", "layers.0.add_1")."""
        per_module = {}
        for op in self.ops:
            if op.kind is not None:
                per_module.setdefault(op.module, []).append(op)
        for module, ops in per_module.items():
            if len(ops) == 1 and module in leaf_modules:
                ops[0].value_name = module
                continue
            seen = {}
            for op in ops:
                k = seen.get(op.kind, 0)
                seen[op.kind] = k + 1
                base = f"{module}.{op.kind}" if module else op.kind
                op.value_name = base if k == 0 else f"{base}_{k}"

    def print(self, result):
        lines = []
        attrs = ""
        if self.model_attrs is not None:
            attrs = " attributes {mapp.model = " + format_attr(self.model_attrs) + "}"
        lines.append(f"module{attrs} {{")
        for name, shape, elem in self.params:
            attrs = {"sym_name": name, **self.init_attrs(name, shape)}
            entries = [_attr_entry(k, v) for k, v in attrs.items()]
            entries.insert(1, f"type = {tensor_type(shape, elem)}")
            lines.append(f'  "mapp.param"() {{{", ".join(entries)}}} : () -> ()')
        sig = ", ".join(f"{a.ssa}: {a.type}" for a in self.args)
        lines.append(f"  func.func @forward({sig}) -> {result.type} {{")
        for op in self.ops:
            attrs = dict(op.attrs)
            if op.value_name is not None:
                attrs = {"mapp.name": op.value_name, **attrs}
            entries = [_attr_entry(k, v) for k, v in attrs.items()]
            attr_text = (" {" + ", ".join(entries) + "}") if entries else ""
            operands = ", ".join(v.ssa for v in op.operands)
            in_types = ", ".join(v.type for v in op.operands)
            if len(op.results) > 1:
                outs = ", ".join(r.type for r in op.results)
                lines.append(f'    {op.ssa}:{len(op.results)} = "{op.name}"({operands}){attr_text} : '
                             f"({in_types}) -> ({outs})")
                continue
            lines.append(f'    {op.result.ssa} = "{op.name}"({operands}){attr_text} : '
                         f"({in_types}) -> {op.result.type}")
        lines.append(f"    func.return {result.ssa} : {result.type}")
        lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"

"""Trace an nn.Module to an aten-level torch.fx graph: make_fx (torch 1.13,
and on request any later torch), or torch.export (torch >= 2.5 by default;
`MAPP_TRACER=make_fx|export` overrides).

make_fx in torch 1.13 records neither the nn.Module path nor the Python
source of a node, and the exporter needs both: the module path names the mapp
value (`mapp.name`), the source line goes into every error message.  So while
tracing we keep a stack of module paths (forward hooks) and wrap
`torch.fx.Graph.create_node` to stamp each new node with
  meta["mapp_module"]  innermost module path ("" for the root), and
  meta["mapp_source"]  "file:line" of the innermost frame outside torch,
                       the standard library and this package (the user's code).
"""

import contextlib
import functools
import os
import re
import sys
import sysconfig

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

_SKIP_DIRS = tuple(
    os.path.realpath(d) + os.sep
    for d in {os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"]}
)
# The exporter's own files (reference.py, a model, is user code).
_HERE = os.path.dirname(os.path.realpath(__file__))
_SKIP_FILES = {os.path.join(_HERE, f) for f in ("trace.py", "lower.py", "attention.py", "export.py")}


@functools.lru_cache(maxsize=None)
def _plumbing():
    """Code objects of the MoE ops' call plumbing (moe.py), skipped like the
    exporter's files: an error names the line that called the op."""
    from . import moe
    return frozenset({moe._call.__code__, moe._Differentiable.forward.__code__})


def _user_source():
    frame = sys._getframe(1)
    skip = _plumbing()
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if (not path.startswith(_SKIP_DIRS) and path not in _SKIP_FILES
                and frame.f_code not in skip
                and not frame.f_code.co_filename.startswith("<")):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown source>"


@contextlib.contextmanager
def _recording(module):
    stack = []
    handles = []
    def post(m, a, r):
        stack.pop()  # returns None: a hook's return value replaces the output

    for path, mod in module.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, a, path=path: stack.append(path)))
        handles.append(mod.register_forward_hook(post))
    original = torch.fx.Graph.create_node

    def create_node(self, *args, **kwargs):
        node = original(self, *args, **kwargs)
        node.meta["mapp_module"] = stack[-1] if stack else ""
        node.meta["mapp_source"] = _user_source()
        return node

    torch.fx.Graph.create_node = create_node
    try:
        yield
    finally:
        torch.fx.Graph.create_node = original
        for h in handles:
            h.remove()


def default_tracer():
    forced = os.environ.get("MAPP_TRACER")
    if forced:
        if forced not in ("make_fx", "export"):
            raise ValueError(f"MAPP_TRACER={forced}: expected make_fx or export")
        return forced
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return "export" if (major, minor) >= (2, 5) and hasattr(torch, "export") else "make_fx"


def trace(module, tokens, targets, pick=lambda out: out, tracer=None):
    """Returns (fx.GraphModule of pick(module(tokens, targets)) at aten level,
    lifted): pick selects the loss from what forward returns; lifted lists,
    per placeholder, ("input", i) or, for graphs whose weights are inputs
    (torch.export), ("param", tensor) / ("const", tensor).  Nodes carry
    meta["tensor_meta"] (or meta["val"]) and the mapp_module/mapp_source
    stamps."""
    if (tracer or default_tracer()) == "export":
        if not hasattr(torch, "export"):
            from .values import ExportError
            raise ExportError(f"torch {torch.__version__} has no torch.export (use make_fx)")
        return _export(module, tokens, targets, pick)
    with _recording(module):
        gm = make_fx(lambda t, y: pick(module(t, y)))(tokens, targets)
    return gm, [("input", 0), ("input", 1)]


class _Picked(torch.nn.Module):
    """module with forward's loss picked (torch.export traces modules)."""

    def __init__(self, module, pick):
        super().__init__()
        self.m = module
        self.pick = pick

    def forward(self, tokens, targets):
        return self.pick(self.m(tokens, targets))


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _export(module, tokens, targets, pick):
    wrapper = _Picked(module, pick)
    ep = torch.export.export(wrapper, (tokens, targets), strict=False)
    ep = ep.run_decompositions(_decompositions())
    gm = ep.graph_module
    lifted, user = [], 0
    by_name = {spec.arg.name: spec for spec in ep.graph_signature.input_specs}
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        spec = by_name[node.name]
        kind = spec.kind.name
        if kind == "USER_INPUT":
            lifted.append(("input", user))
            user += 1
        elif kind == "PARAMETER":
            lifted.append(("param", wrapper.get_parameter(spec.target)))
        elif kind in ("BUFFER", "CONSTANT_TENSOR"):
            t = ep.constants.get(spec.target)
            lifted.append(("const", t if t is not None else ep.state_dict[spec.target]))
        else:
            raise ValueError(f"torch.export input {node.name} of kind {kind}")
    for node in gm.graph.nodes:
        node.meta["mapp_module"] = _module_path(node.meta.get("nn_module_stack"))
        node.meta["mapp_source"] = _stack_source(node.meta.get("stack_trace"))
    return gm, lifted


def _decompositions():
    """torch.export's default (core ATen) decompositions, less those of the
    ops the lowering takes as they are.  The default table would take apart
    masked_fill (into where), nll_loss_forward (gather, ne, where), silu
    (sigmoid), sdpa (its math) and dropout: the lowering's patterns match
    those ops whole, as make_fx (which decomposes nothing) records them.
    Ops without a lowering still decompose (linear into t + addmm, ...)."""
    from .lower import Lowering
    keep = Lowering.lowered_ops()
    if hasattr(torch.export, "default_decompositions"):  # torch >= 2.6
        table = torch.export.default_decompositions()
    else:
        from torch._decomp import core_aten_decompositions
        table = core_aten_decompositions()
    for op in list(table.keys()):
        packet = getattr(op, "overloadpacket", None)
        if packet is not None and packet.__name__ in keep:
            del table[op]
    return table


def _module_path(stack):
    """Innermost nn_module_stack entry as a path of the user's module."""
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", str(path))
    path = re.sub(r"\._modules\['([^']+)'\]|\[(\d+)\]", lambda m: "." + (m.group(1) or m.group(2)), path)
    path = path.lstrip(".")
    return path[2:] if path.startswith("m.") else ("" if path == "m" else path)


def _stack_source(text):
    for path, line in reversed(_FRAME.findall(text or "")):
        real = os.path.realpath(path)
        if not real.startswith(_SKIP_DIRS) and real not in _SKIP_FILES and not path.startswith("<"):
            return f"{path}:{line}"
    return "<unknown source>"


def parameter_names(module):
    """id(tensor) -> state_dict name for every parameter (first name wins
    for a tensor registered twice)."""
    names = {}
    for name, p in module.named_parameters():
        names.setdefault(id(p), name)
    return names


def leaf_modules(module):
    return {path for path, m in module.named_modules() if not any(True for _ in m.children())}

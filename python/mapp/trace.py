"""Trace an nn.Module to an aten-level torch.fx graph (make_fx, torch 1.13).

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
import os
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


def _user_source():
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if (not path.startswith(_SKIP_DIRS) and path not in _SKIP_FILES
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


def trace(module, tokens, targets, pick=lambda out: out):
    """Returns the fx.GraphModule of pick(module(tokens, targets)) at aten
    level (pick selects the loss from what forward returns).  Nodes carry
    meta["tensor_meta"] (shape and dtype; tracing runs the model once)."""
    with _recording(module):
        return make_fx(lambda t, y: pick(module(t, y)))(tokens, targets)


def parameter_names(module):
    """id(tensor) -> state_dict name for every parameter (first name wins
    for a tensor registered twice)."""
    names = {}
    for name, p in module.named_parameters():
        names.setdefault(id(p), name)
    return names


def leaf_modules(module):
    return {path for path, m in module.named_modules() if not any(True for _ in m.children())}

"""PyTorch nn.Module -> mapp IR (+ initial weights as safetensors).

    PYTHONPATH=python /usr/bin/python3 -m mapp.export \\
        --module mapp.reference:GPT --config examples/gpt-tiny.json \\
        -o model.mlir --weights init.safetensors [--seed S] \\
        [--weights-from their.pt] [--output loss|INDEX|KEY] [--no-recognize]

The module is built as Class(config_dict) (plus seed=S when the class takes a
`seed` argument, else torch.manual_seed(S) before construction) and traced as
module(tokens, targets) with int64 [micro_batch_size, seq_length] inputs (the
IR declares them i32: token ids are the same numbers, and mapp-run feeds i32).
It may return the loss, a tuple/list, a dict or a dataclass: `--output` picks
the loss (`loss`: the element, key or attribute named loss, or the only scalar
tensor of a tuple; an INDEX; a KEY).  `--weights-from FILE` loads the user's
own state_dict (torch.save or safetensors) instead of fresh initialization.
Every aten op lowers to the dialect's tensor algebra; recognized
compositions (rotary, norms written out, attention, tanh gelu) are rewritten
into the fused ops, never required: `--no-recognize` (or MAPP_RECOGNIZE=0)
switches that recognition off (docs/models.md, "What the exporter lowers
generically").
The IR is one func.func @forward(%tokens, %targets) -> tensor<f32> over mapp
ops in generic form, with a mapp.param per parameter (state_dict names).  Exit
status 1 with a message naming the aten op and the source line when something
cannot be expressed in mapp.
"""

import argparse
import dataclasses
import importlib
import inspect
import json
import sys

import torch

from . import ir, safetensors
from .algebra import recognition_default
from .config import ConfigError, normalize_config
from .lower import Lowering
from .trace import leaf_modules, parameter_names, trace
from .values import Const, ExportError, Param, Tensor


def example_inputs(config, dtype=torch.int32):
    """[mbs, seq] tokens and targets (distinct tensors: make_fx tracks
    tensors by identity).  The CLI traces with int64 (what user code written
    for nn.Embedding / F.cross_entropy expects); the IR says i32 either way."""
    mbs = int(config.get("micro_batch_size", 1))
    seq = int(config.get("seq_length", config.get("n_positions", 0)))
    vocab = int(config.get("vocab_size", 2))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (mbs, seq), generator=gen, dtype=dtype)
    targets = torch.randint(0, vocab, (mbs, seq), generator=gen, dtype=dtype)
    return tokens, targets


def export_module(module, tokens, targets, model_attrs=None, output="loss", tracer=None,
                  recognize=None):
    """Returns the mapp IR text of module(tokens, targets); `output` picks
    the loss out of what forward returns (see pick_loss); recognize=False
    lowers without pattern recognition (None: MAPP_RECOGNIZE, default on)."""
    if recognize is None:
        recognize = recognition_default()
    module.train()  # dropout layers show up as mapp.dropout
    gm, lifted = trace(module, tokens, targets, lambda out: pick_loss(out, output), tracer)
    b = ir.Builder()
    b.model_attrs = model_attrs
    for name, p in module.named_parameters():
        b.param(name, p.shape, ir.elem_type(p.dtype))
    # Token ids are i32 in mapp whatever the traced dtype (int64 ids convert exactly).
    index = lambda t: "i32" if t.dtype in (torch.int32, torch.int64) else ir.elem_type(t.dtype)
    user = [Tensor(b.arg("tokens", tokens.shape, index(tokens))),
            Tensor(b.arg("targets", targets.shape, index(targets)))]
    names = parameter_names(module)
    args = []
    for kind, what in lifted:  # torch.export passes weights and buffers as inputs
        if kind == "input":
            args.append(user[what])
        elif kind == "param":
            args.append(Param(names[id(what)], what.shape, ir.elem_type(what.dtype)))
        else:
            args.append(Const(what.detach().clone()))
    loss = Lowering(gm, b, names, recognize=recognize).run(args)
    b.prune(loss)
    b.assign_names(leaf_modules(module))
    return b.print(loss)


def pick_loss(out, output="loss"):
    """The loss out of forward's result: a tensor, a tuple/list, a dict or a
    dataclass.  output = "loss" (key/attribute "loss", or the only scalar
    tensor of a sequence), an index or a key."""
    if isinstance(out, torch.Tensor):
        if output not in ("loss", "0"):
            raise ExportError(f"--output {output}: forward returns a single tensor")
        return out
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        out = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
    if isinstance(out, dict):
        if output not in out:
            raise ExportError(f"--output {output}: forward returns keys {sorted(map(str, out))}")
        val = out[output]
    elif isinstance(out, (tuple, list)):
        if output.lstrip("-").isdigit():
            i = int(output)
            if not -len(out) <= i < len(out):
                raise ExportError(f"--output {output}: forward returns {len(out)} values")
            val = out[i]
        elif output == "loss":
            scalars = [i for i, v in enumerate(out) if isinstance(v, torch.Tensor) and v.dim() == 0]
            if len(scalars) != 1:
                raise ExportError(f"forward returns {len(out)} values, {len(scalars)} of them "
                                  "scalar tensors: pick the loss with --output INDEX")
            val = out[scalars[0]]
        else:
            raise ExportError(f"--output {output}: forward returns a tuple; give an index")
    else:
        raise ExportError(f"forward returns {type(out).__name__}; expected a tensor, tuple, "
                          "dict or dataclass")
    if not isinstance(val, torch.Tensor) or val.dim() != 0:
        raise ExportError(f"--output {output}: not a scalar loss tensor")
    return val


def load_weights(module, path):
    """Loads a state_dict saved by torch.save (or a .safetensors file) into
    module; names must match its state_dict exactly (tied weights may appear
    once or under every name)."""
    try:
        tensors, _ = safetensors.load(path)
    except ValueError:
        try:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle errors come in many types
            raise ExportError(f"--weights-from {path}: neither safetensors nor a torch.save "
                              f"state_dict ({e})") from None
        if isinstance(tensors, dict) and "state_dict" in tensors and isinstance(tensors["state_dict"], dict):
            tensors = tensors["state_dict"]
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise ExportError(f"--weights-from {path}: not a state_dict (name -> tensor)")
    own = module.state_dict()
    params = {name for name, _ in module.named_parameters()}
    missing = [k for k in params if k not in tensors]
    extra = [k for k in tensors if k not in own]
    if missing or extra:
        raise ExportError(f"--weights-from {path}: " + "; ".join(
            part for part in (f"missing {missing}" if missing else "",
                              f"unexpected {extra}" if extra else "") if part))
    for k, v in tensors.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise ExportError(f"--weights-from {path}: {k} has shape {list(v.shape)}, "
                              f"the module's is {list(own[k].shape)}")
    with torch.no_grad():
        for k, t in own.items():
            if k in tensors:
                t.copy_(tensors[k].to(t.dtype))


def build_module(spec, config, seed=None):
    mod_name, _, cls_name = spec.partition(":")
    if not cls_name:
        raise ExportError(f"--module must be pkg.mod:Class, got '{spec}'")
    cls = getattr(importlib.import_module(mod_name), cls_name)
    takes_seed = "seed" in inspect.signature(cls).parameters
    if seed is not None and not takes_seed:
        torch.manual_seed(seed)
    return cls(config, seed=seed) if seed is not None and takes_seed else cls(config)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m mapp.export", description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True, help="pkg.mod:Class of the nn.Module")
    ap.add_argument("--config", required=True, help="model config JSON, passed to Class(config)")
    ap.add_argument("-o", "--mlir", dest="mlir", required=True, help="mapp IR output (.mlir)")
    ap.add_argument("--weights", help="write the initial parameters here (safetensors)")
    ap.add_argument("--seed", type=int, help="initialization seed")
    ap.add_argument("--weights-from", metavar="FILE",
                    help="the module's own weights (torch.save state_dict or safetensors) "
                         "instead of fresh initialization")
    ap.add_argument("--output", dest="pick", default="loss", metavar="loss|INDEX|KEY",
                    help="which of forward's results is the loss (default: loss)")
    ap.add_argument("--tracer", choices=("make_fx", "export"),
                    help="how to trace (default: torch.export on torch >= 2.5, else make_fx; "
                         "env MAPP_TRACER)")
    ap.add_argument("--no-recognize", action="store_true",
                    help="no pattern recognition: lower every op to the tensor algebra "
                         "(env MAPP_RECOGNIZE=0 does the same)")
    a = ap.parse_args(argv)
    try:
        with open(a.config) as f:
            raw = json.load(f)
        module = build_module(a.module, raw, a.seed)
        attrs = module.mapp_model_attrs() if hasattr(module, "mapp_model_attrs") else None
        cfg = normalize_config(raw) if attrs is not None else raw
        if a.weights_from:
            load_weights(module, a.weights_from)
        tokens, targets = example_inputs(cfg, torch.int64)
        text = export_module(module, tokens, targets, _model_attrs(attrs) if attrs else None,
                             output=a.pick, tracer=a.tracer,
                             recognize=False if a.no_recognize else None)
    except (ExportError, ConfigError, OSError, ValueError, json.JSONDecodeError) as e:
        print(f"mapp.export: error: {e}", file=sys.stderr)
        return 1
    with open(a.mlir, "w") as f:
        f.write(text)
    if a.weights:
        # Parameters only, under every state_dict name (tied weights twice):
        # buffers (masks, rotary tables) are folded into the IR.
        params = {id(p) for p in module.parameters()}
        tensors = {k: v for k, v in module.state_dict(keep_vars=True).items() if id(v) in params}
        safetensors.save(tensors, a.weights, {"format": "pt", "producer": "mapp.export"})
    return 0


def _model_attrs(cfg):
    """Normalized config -> `mapp.model` dict: `kind` for the variant, ints as
    i64, floats as f64 (the importer writes the same)."""
    out = {"kind": cfg["variant"]}
    for k, v in cfg.items():
        if k == "variant":
            continue
        out[k] = ir.F64(v) if isinstance(v, float) else ir.Array(v) if isinstance(v, list) else v
    return out


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch nn.Module -> mapp IR (+ initial weights as safetensors).

    PYTHONPATH=python /usr/bin/python3 -m mapp.export \\
        --module mapp.reference:GPT --config examples/gpt-tiny.json \\
        -o model.mlir --weights init.safetensors [--seed S]

The module is built as Class(config_dict) (plus seed=S when the class takes a
`seed` argument, else torch.manual_seed(S) before construction) and traced as
module(tokens, targets) with int32 [micro_batch_size, seq_length] inputs; it
must return the scalar loss.  The IR is one func.func @forward(%tokens,
%targets) -> tensor<f32> over mapp ops in generic form, with a mapp.param per
parameter (state_dict names).  Exit status 1 with a message naming the aten op
and the source line when something cannot be expressed in mapp.
"""

import argparse
import importlib
import inspect
import json
import sys

import torch

from . import ir, safetensors
from .config import ConfigError, normalize_config
from .lower import Lowering
from .trace import leaf_modules, parameter_names, trace
from .values import ExportError, Tensor


def example_inputs(config):
    """int32 [mbs, seq] tokens and targets (distinct tensors: make_fx tracks
    tensors by identity)."""
    mbs = int(config.get("micro_batch_size", 1))
    seq = int(config.get("seq_length", config.get("n_positions", 0)))
    vocab = int(config.get("vocab_size", 2))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (mbs, seq), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, vocab, (mbs, seq), generator=gen, dtype=torch.int32)
    return tokens, targets


def export_module(module, tokens, targets, model_attrs=None):
    """Returns the mapp IR text of module(tokens, targets)."""
    module.train()  # dropout layers show up as mapp.dropout
    gm = trace(module, tokens, targets)
    b = ir.Builder()
    b.model_attrs = model_attrs
    for name, p in module.named_parameters():
        b.param(name, p.shape, ir.elem_type(p.dtype))
    args = [Tensor(b.arg("tokens", tokens.shape, ir.elem_type(tokens.dtype))),
            Tensor(b.arg("targets", targets.shape, ir.elem_type(targets.dtype)))]
    loss = Lowering(gm, b, parameter_names(module)).run(args)
    b.assign_names(leaf_modules(module))
    return b.print(loss)


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
    ap.add_argument("-o", "--output", required=True, help="mapp IR output (.mlir)")
    ap.add_argument("--weights", help="write the initial parameters here (safetensors)")
    ap.add_argument("--seed", type=int, help="initialization seed")
    a = ap.parse_args(argv)
    try:
        with open(a.config) as f:
            raw = json.load(f)
        module = build_module(a.module, raw, a.seed)
        attrs = module.mapp_model_attrs() if hasattr(module, "mapp_model_attrs") else None
        cfg = normalize_config(raw) if attrs is not None else raw
        tokens, targets = example_inputs(cfg)
        text = export_module(module, tokens, targets, _model_attrs(attrs) if attrs else None)
    except (ExportError, ConfigError, OSError, json.JSONDecodeError) as e:
        print(f"mapp.export: error: {e}", file=sys.stderr)
        return 1
    with open(a.output, "w") as f:
        f.write(text)
    if a.weights:
        safetensors.save(module.state_dict(), a.weights, {"format": "pt", "producer": "mapp.export"})
    return 0


def _model_attrs(cfg):
    """Normalized config -> `mapp.model` dict: `kind` for the variant, ints as
    i64, floats as f64 (the importer writes the same)."""
    out = {"kind": cfg["variant"]}
    for k, v in cfg.items():
        if k == "variant":
            continue
        out[k] = ir.F64(v) if isinstance(v, float) else v
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Issue 37: models the runtime has no hand-written kernel for (a GeGLU MLP
with written-out RMS norms, x·rsqrt(mean(x²) + eps)·w, and a squared-ReLU
MLP with written-out LayerNorms, (x − mean)/sqrt(var + eps)·w + b, both
with QK-norm: models/fused_mlp.py), exported with the generic lowering (--no-recognize),
fused by --mapp-fuse on the training graph, train 20 steps on mapp-run's CPU
backend like PyTorch (every loss and step-0 gradient within 1e-5 relative),
and like the unfused plan of the same graph (every loss within 1e-6; the
evaluator rounds as the unfused kernels do, so they are in fact equal).
Every norm, forward and backward, is one region (a row program: its row
sums in the middle)."""

import collections
import os
import re

import pytest
import torch

from mapp import safetensors
from conftest import require_tool
from mapp.export import pick_loss
from train_harness import compile_and_train, export, plan_losses, run, train_torch_and_compare

STEPS = 20
HERE = os.path.dirname(os.path.abspath(__file__))
CFG = dict(vocab_size=256, micro_batch_size=2, seq_length=8, dim=16, n_heads=2, n_layers=1,
           hidden=32, eps=1e-5)


def op_counts(text):
    return collections.Counter(re.findall(r"mapp\.(\w+) ", text))


def fused_and_unfused(tmp_path, module, cfg):
    """The module exported generic (--no-recognize), trained STEPS steps
    with and without -mapp-fuse in tmp_path/fused and tmp_path/unfused."""
    args = dict(module=module, export_args=["--no-recognize"], pythonpath=[HERE])
    (tmp_path / "fused").mkdir()
    (tmp_path / "unfused").mkdir()
    return (compile_and_train(tmp_path / "fused", cfg, STEPS, opt_args=["-mapp-fuse"], **args),
            compile_and_train(tmp_path / "unfused", cfg, STEPS, **args))


def like_unfused_and_pytorch(tmp_path, cls, cfg, fused, plain):
    """Every fused loss within 1e-6 of the unfused plan's, and the fused run
    within 1e-5 of PyTorch's cls(cfg) (losses and step-0 gradients); the
    worst relative loss difference to PyTorch."""
    for f, p in zip(fused[0], plain[0]):
        assert abs(f["loss"] - p["loss"]) <= 1e-6 * abs(p["loss"]), (f, p)
    torch.manual_seed(0)
    weights = safetensors.load(tmp_path / "fused" / "init.safetensors")[0]
    return train_torch_and_compare(cls(cfg), weights, *fused, tolerance=1e-5)


@pytest.mark.parametrize("mlp,norm", [("geglu", "rms"), ("sqrelu", "layer")])
def test_fused_model_trains_like_pytorch_and_unfused(tmp_path, mlp, norm):
    from models.fused_mlp import FusedMlp
    cfg = {**CFG, "mlp": mlp, "norm": norm}
    fused, plain = fused_and_unfused(tmp_path, "models.fused_mlp:FusedMlp", cfg)

    ops = op_counts((tmp_path / "fused" / "train.mlir").read_text())
    before = op_counts((tmp_path / "unfused" / "train.mlir").read_text())
    # The activation and the norms' elementwise chains are regions now;
    # no fused op the runtime has a kernel for was involved.
    assert ops["fused"] >= 8, ops
    assert ops["rms_norm"] == ops["gelu"] == ops["silu"] == 0, ops
    assert sum(ops.values()) <= sum(before.values()) - ops["fused"], (ops, before)
    # The activation written with the algebra is one region.
    activation = {"geglu": "gelu[tanh](%i0); mul(%0, %i1)",
                  "sqrelu": "maximum(%i0, %i1); pow[2](%0)"}[mlp]
    text = (tmp_path / "fused" / "train.mlir").read_text()
    assert f'program = "{activation}"' in text
    # Every norm (attention, q, k, MLP, final: 5) is one region forward and
    # one backward (a row program: its row sums in the middle), and no sum
    # over the rows is left outside a region (a bias or gain gradient's sum
    # over the leading dims may be).
    programs = re.findall(r'program = "([^"]*)"', text)
    forward = {"rms": r"pow\[2\]\(%i?\d+\); reduce_sum\[\d\]\(%\d+\); row scale\[",
               "layer": r"reduce_sum\[\d\]\(%i?\d+\); row scale\[[^\]]*\]\(%\d+\); sub\("}[norm]
    assert sum(bool(re.search(forward, p)) for p in programs) == 5, programs
    row_programs = [p for p in programs if "row " in p]
    assert len(row_programs) >= 10, programs
    for dims, shape in re.findall(r"mapp\.reduce_sum %\w+ \{dims = array<i64: ([\d, ]+)>.*"
                                  r": \(tensor<([\dx]+)xf32>\)", text):
        assert len(shape.split("x")) - 1 not in [int(d) for d in dims.split(",")], (dims, shape)
    worst = like_unfused_and_pytorch(tmp_path, FusedMlp, cfg, fused, plain)
    same = sum(f["loss"] == p["loss"] for f, p in zip(fused[0], plain[0]))
    print(f"{mlp}/{norm}: {ops['fused']} regions ({len(row_programs)} row programs); worst relative loss difference to PyTorch over "
          f"{STEPS} steps {worst:.2e}; {same}/{STEPS} losses bit-equal to the unfused plan")


def test_maxima_model_fuses_and_trains_like_pytorch(tmp_path):
    """models/maxout_zloss.py (torch.max over a dim and of two tensors,
    amax, logsumexp: mapp.reduce_max and its gradient), exported generic
    and fused: the hand-written stable softmax (its row max, exp, row sum
    and division) is one row program with the max in it; 20 steps equal
    to the unfused plan's (1e-6) and within 1e-5 of PyTorch."""
    from models.maxout_zloss import MaxoutGPT
    cfg = dict(vocab_size=256, micro_batch_size=2, seq_length=8, d_model=16, n_heads=2,
               n_layers=1, hidden=12, pieces=3)
    fused, plain = fused_and_unfused(tmp_path, "models.maxout_zloss:MaxoutGPT", cfg)
    text = (tmp_path / "fused" / "train.mlir").read_text()
    programs = re.findall(r'program = "([^"]*)"', text)
    softmax = [p for p in programs if re.search(
        r"reduce_max\[3\]\(%i?\d+\); .*exp\(.*reduce_sum\[3\]\(%\d+\); .*div\(", p)]
    assert softmax, programs
    worst = like_unfused_and_pytorch(tmp_path, MaxoutGPT, cfg, fused, plain)
    print(f"maxout-zloss: {len(programs)} regions; worst relative loss difference to "
          f"PyTorch over {STEPS} steps {worst:.2e}")



@pytest.mark.parametrize("name,kind", [("meta-llama", "rms_norm"), ("hf-gpt2", "layer_norm")])
def test_decomposed_norms_train_like_the_norm_kernels(tmp_path, name, kind):
    """Public-style models whose norms the exporter recognizes (mapp.rms_norm,
    mapp.layer_norm: the runtime's norm kernels): --mapp-decompose-norms
    writes them with the algebra again and --mapp-fuse makes every norm,
    forward and backward, a generated row program. 20 CPU steps like the
    norm kernels (1e-5 relative) and like PyTorch (losses and step-0
    gradients, 1e-5)."""
    from test_export_models import MODELS, SHAPE, build
    spec, cfg, out, _ = MODELS[name]
    cfg = {**SHAPE, **cfg}
    args = dict(module=spec, export_args=["--output", out], pythonpath=[HERE])
    (tmp_path / "fused").mkdir()
    (tmp_path / "kernels").mkdir()
    fused = compile_and_train(tmp_path / "fused", cfg, STEPS, pre_args=["-mapp-decompose-norms"],
                              opt_args=["-mapp-fuse"], **args)
    kernels = compile_and_train(tmp_path / "kernels", cfg, STEPS, **args)
    plain_ops = op_counts((tmp_path / "kernels" / "train.mlir").read_text())
    fused_text = (tmp_path / "fused" / "train.mlir").read_text()
    fused_ops = op_counts(fused_text)
    assert plain_ops[kind] >= 2 and plain_ops[kind + "_grad"] >= 2, plain_ops
    assert not fused_ops[kind] and not fused_ops[kind + "_grad"], fused_ops
    # A row program per norm, forward and backward (its row sums over dim 2).
    rows = re.findall(r'program = "[^"]*reduce_sum\[2\][^"]*"', fused_text)
    assert len(rows) >= 2 * plain_ops[kind], rows
    for f, k in zip(fused[0], kernels[0]):
        assert abs(f["loss"] - k["loss"]) <= 1e-5 * abs(k["loss"]), (f, k)
    torch.manual_seed(0)
    weights = safetensors.load(tmp_path / "fused" / "init.safetensors")[0]
    worst = train_torch_and_compare(build(spec, cfg), weights, *fused, tolerance=1e-5,
                                    loss_of=lambda o: pick_loss(o, out))
    print(f"{name}: {plain_ops[kind]} norms decomposed into {len(rows)} row programs; "
          f"worst relative loss difference to PyTorch {worst:.2e}")


def _mistral_two_layers():
    from test_algebra_models import MODELS, SHAPE
    spec, cfg, _ = MODELS["mistral-window"]
    return spec, {**SHAPE, **cfg, "num_hidden_layers": 2}


@pytest.mark.parametrize("model,layout", [
    ("fused-mlp", "dp=2 zero1=true"),
    ("mistral-window", "pp=2 microbatches=2 schedule=1f1b")])
def test_train_pipeline_fuses_on_parallel_layouts(tmp_path, model, layout):
    """--mapp-train-pipeline's fusion (on by default) on a generic export: the GeGLU +
    RMS-norm model over two data-parallel ranks (gradient collectives,
    ZeRO-1's sharded update) and the sliding-window Mistral over two
    pipeline stages (sends between them) train like the same layout
    unfused (every loss within 1e-6) and like one rank unfused with the
    same 4 sequences a step in two microbatches (1e-5), with regions in
    the plan."""
    if model == "fused-mlp":
        spec, cfg = "models.fused_mlp:FusedMlp", {**CFG, "mlp": "geglu", "norm": "rms",
                                                  "n_layers": 2}
    else:
        spec, cfg = _mistral_two_layers()
    export(tmp_path, cfg, spec, ["--no-recognize"], [HERE])
    losses, regions = {}, {}
    runs = {"one": ("microbatches=2", "false"), "plain": (layout, "false"),
            "fused": (layout, "true"), "default": (layout, None)}
    for name, (opts, fuse) in runs.items():
        pipeline = f"--mapp-train-pipeline={opts} optimizer=adamw lr=1e-3"
        if fuse:
            pipeline += f" fuse={fuse}"
        run([require_tool("mapp-opt"), tmp_path / "model.mlir", pipeline, "-o", tmp_path / f"{name}.mlir"])
        regions[name] = op_counts((tmp_path / f"{name}.mlir").read_text())["fused"]
        losses[name] = plan_losses(tmp_path, name, 4)
    # The pipeline fuses by default (docs/fusion.md, "On by default").
    assert regions["fused"] >= 8 and regions["plain"] == regions["one"] == 0, regions
    assert regions["default"] == regions["fused"], regions
    assert losses["default"] == losses["fused"], losses
    assert len(losses["fused"]) == 4
    assert losses["fused"] == pytest.approx(losses["plain"], rel=1e-6), losses
    assert losses["fused"] == pytest.approx(losses["one"], rel=1e-5), losses

"""End-to-end Megatron-style parallelism: compiler passes → plan → runtime.

A small GPT (4 layers, 4 heads, hidden 32, vocab 256, tied embeddings) is
exported once with its initial weights. The reference is the single-rank
step (-mapp-autodiff -mapp-optimizer) on the whole global batch of 8 rows as
one microbatch. Every parallel layout is compiled with
--mapp-train-pipeline (tp, pp, dp ∈ {1, 2}, plus interleaved chunks = 2)
so that dp · microbatches · micro_batch_size = 8: each step sees the same
global batch, the per-microbatch loss scale 1/M and the dp average make the
accumulated gradient that of the global mean loss. Each plan trains 20
steps from the same full-tensor --weights (the runtime slices the shards)
with AdamW (also LLaMA, and SGD) and gradient clipping; every step's loss and grad norm must match
the reference within 1e-5 relative, over --comm=local and (a subset) over
--comm=mpi.
"""
import json
import os
import pathlib
import shutil
import struct
import subprocess

import pytest
import sys

from conftest import ROOT, read_st, require_tool

STEPS = 20
TOLERANCE = 1e-5
GLOBAL_ROWS = 8   # rows of the step's global batch
MBS = 2           # micro_batch_size of the parallel plans
CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"
MPIRUN = shutil.which("mpirun")
CFG = {"variant": "gpt", "num_layers": 4, "hidden_size": 32,
       "num_attention_heads": 4, "seq_length": 16, "vocab_size": 256,
       "micro_batch_size": MBS, "tie_embeddings": True}
OPT = "optimizer=adamw lr=0.003 beta1=0.9 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0"


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=600, **kw)
    assert r.returncode == 0, f"{cmd[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def export(tmp, cfg, rows, weights=None):
    cfg = dict(cfg, micro_batch_size=rows)
    (tmp / f"cfg{rows}.json").write_text(json.dumps(cfg))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    args = [sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
            "--config", tmp / f"cfg{rows}.json", "-o", tmp / f"model{rows}.mlir",
            "--seed", 7]
    if weights:
        args += ["--weights", weights]
    run(args, env=env)
    return tmp / f"model{rows}.mlir"


def to_plan(tmp, mlir, passes, name):
    run([require_tool("mapp-opt"), mlir, *passes, "-o", tmp / f"{name}.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir",
         "-o", tmp / f"{name}.mplan"])
    return tmp / f"{name}.mplan"


def train(plan, out, world, comm, weights):
    metrics, dump, save = out / "m.jsonl", out / "b.jsonl", out / "w.safetensors"
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", STEPS,
            "--seed", 11, "--weights", weights, "--metrics", metrics,
            "--dump-batches", dump, "--save", save, "--quiet"]
    if comm == "mpi":
        run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", world,
             require_tool("mapp-run"), *args, "--comm=mpi", "--threads", 1])
    else:
        run([require_tool("mapp-run"), *args, "--comm=local", "--threads", 1])
    return ([json.loads(l) for l in metrics.read_text().splitlines()],
            [json.loads(l) for l in dump.read_text().splitlines()], read_st(save))


def prepare(d, cfg, opt):
    """Exports the model (micro_batch_size MBS for the parallel plans, the
    whole global batch for the reference) and trains the reference."""
    weights = d / "init.safetensors"
    model = export(d, cfg, MBS, weights)
    ref_model = export(d, cfg, GLOBAL_ROWS)
    plan = to_plan(d, ref_model, ["-mapp-autodiff", f"-mapp-optimizer={opt}"], "ref")
    (d / "ref").mkdir()
    ref = train(plan, d / "ref", 1, "local", weights)
    return d, model, weights, ref, opt


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("gpt"), CFG, OPT)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def check(ref, got, dp, micro):
    ref_m, ref_b, ref_w = ref
    m, b, w = got
    assert len(m) == STEPS
    worst = 0.0
    for step, (x, y) in enumerate(zip(m, ref_m)):
        e = rel(x["loss"], y["loss"])
        worst = max(worst, e)
        assert e <= TOLERANCE, f"step {step}: loss {x['loss']:.8f} vs {y['loss']:.8f} ({e:.2e})"
        en = rel(x["grad_norm"], y["grad_norm"])
        assert en <= TOLERANCE, f"step {step}: grad_norm {x['grad_norm']} vs {y['grad_norm']} ({en:.2e})"
        assert x["tokens"] == y["tokens"]
    # The global batch is the same: the rows of dp rank d's microbatch m are
    # rows (d·M + m)·MBS ... of the reference's one big microbatch.
    ref_rows = {r["step"]: r for r in ref_b}
    for r in b:
        want = ref_rows[r["step"]]
        lo = (r["dp_rank"] * micro + r["microbatch"]) * MBS
        assert r["tokens"] == want["tokens"][lo:lo + MBS]
        assert r["targets"] == want["targets"][lo:lo + MBS]
    assert m[-1]["loss"] < m[0]["loss"] - 0.3
    # Final parameters, gathered from the shards by --save. Twenty AdamW
    # steps amplify rounding where the second moment is tiny, hence 1e-4.
    assert w.keys() == ref_w.keys()
    for name, (shape, vals) in ref_w.items():
        assert w[name][0] == shape, name
        err = max(abs(p - q) for p, q in zip(w[name][1], vals))
        assert err < 1e-4 * max(1.0, max(abs(q) for q in vals)), (name, err)
    return worst


# (tp, pp, dp, chunks, extra pipeline options)
CONFIGS = [(tp, pp, dp, 1, "") for tp in (1, 2) for pp in (1, 2) for dp in (1, 2)] + \
          [(1, 2, 1, 2, ""), (2, 2, 2, 2, ""), (1, 1, 2, 1, "zero1=true"),
           (2, 2, 2, 1, "zero1=true"), (2, 1, 1, 1, "sequence-parallel=true"),
           (2, 2, 1, 1, "schedule=gpipe"),
           # MegaDPP compiler schedules: split backward (Bi/W blocks, the dp
           # grad_sync moved into W) and breadth-first chunks.
           (2, 2, 1, 1, "schedule=zb-h1"), (1, 2, 2, 1, "schedule=zb-h1"),
           (1, 2, 1, 2, "schedule=bfc"), (1, 2, 1, 2, "schedule=adaptive"),
           # Uneven stages (docs/elastic.md): layers moved off a stage.
           (1, 2, 1, 1, "stage-layers=1,3"), (2, 2, 1, 1, "stage-weights=1,3")]
MPI_CONFIGS = [(2, 1, 1, 1, ""), (1, 2, 2, 1, ""), (2, 2, 2, 2, ""),
               (2, 2, 2, 1, "zero1=true")]


def layout_plan(d, model, tp, pp, dp, chunks, extra, opt=OPT):
    micro = GLOBAL_ROWS // (MBS * dp)
    sched = "interleaved" if chunks > 1 else "1f1b"
    if "schedule=" in extra:
        sched, extra = extra.split("=", 1)[1], ""
    name = f"tp{tp}pp{pp}dp{dp}c{chunks}"
    pipeline = (f"--mapp-train-pipeline=tp={tp} pp={pp} dp={dp} chunks={chunks} "
                f"microbatches={micro} schedule={sched} {opt} {extra}")
    return to_plan(d, model, [pipeline], name), micro


def ids(cs):
    return [f"tp{a}-pp{b}-dp{c}-ch{e}" +
            (f"-{x.replace('schedule=', '').split('=')[0]}" if x else "")
            for a, b, c, e, x in cs]


@pytest.mark.parametrize("tp,pp,dp,chunks,extra", CONFIGS, ids=ids(CONFIGS))
def test_local_matches_single_rank(setup, tmp_path, tp, pp, dp, chunks, extra):
    d, model, weights, ref, opt = setup
    plan, micro = layout_plan(tmp_path, model, tp, pp, dp, chunks, extra)
    got = train(plan, tmp_path, tp * pp * dp, "local", weights)
    worst = check(ref, got, dp, micro)
    print(f"tp{tp} pp{pp} dp{dp} chunks{chunks} {extra}: worst relative loss difference {worst:.2e}")


def test_resume_into_uneven_stages(setup, tmp_path):
    """The re-partitioning switch: 10 steps on the even pp=2 cut (2 | 2),
    checkpoint, resume on 3 | 1 (stage-layers): the checkpoint's tensors
    are re-cut onto the new stages and the run matches the reference."""
    d, model, weights, ref, opt = setup
    even, micro = layout_plan(tmp_path, model, 1, 2, 1, 1, "")
    uneven = to_plan(tmp_path, model, [
        f"--mapp-train-pipeline=pp=2 microbatches={micro} {opt} "
        "stage-layers=3,1"], "uneven")
    common = ["--data", CORPUS, "--tokenizer", "bytes", "--seed", 11,
              "--quiet", "--comm=local", "--threads", 1]
    ck, m1, m2 = tmp_path / "ck", tmp_path / "m1.jsonl", tmp_path / "m2.jsonl"
    run([require_tool("mapp-run"), even, *common, "--steps", 10, "--weights", weights,
         "--save-dir", ck, "--metrics", m1])
    run([require_tool("mapp-run"), uneven, *common, "--steps", STEPS, "--resume", ck,
         "--metrics", m2])
    got = [json.loads(l) for l in m1.read_text().splitlines()] + \
        [json.loads(l) for l in m2.read_text().splitlines()]
    assert [x["step"] for x in got] == list(range(STEPS))
    for x, y in zip(got, ref[0]):
        assert rel(x["loss"], y["loss"]) <= TOLERANCE, (x, y)


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
@pytest.mark.parametrize("tp,pp,dp,chunks,extra", MPI_CONFIGS, ids=ids(MPI_CONFIGS))
def test_mpi_matches_single_rank(setup, tmp_path, tp, pp, dp, chunks, extra):
    r = run([require_tool("mapp-run"), "--help"])
    if "built with communicators: local, mpi" not in r.stdout:
        pytest.skip("mapp-run built without MPI")
    d, model, weights, ref, opt = setup
    plan, micro = layout_plan(tmp_path, model, tp, pp, dp, chunks, extra)
    got = train(plan, tmp_path, tp * pp * dp, "mpi", weights)
    worst = check(ref, got, dp, micro)
    print(f"mpi tp{tp} pp{pp} dp{dp} chunks{chunks} {extra}: worst relative loss difference {worst:.2e}")


# LLaMA-style (RMSNorm, SwiGLU, rotary, untied head) with AdamW, and the GPT
# with SGD + momentum: the widest layouts.
LLAMA = {"variant": "llama", "num_layers": 4, "hidden_size": 32,
         "num_attention_heads": 4, "ffn_hidden_size": 64, "seq_length": 16,
         "vocab_size": 256, "micro_batch_size": MBS, "tie_embeddings": False}
SGD = "optimizer=sgd lr=0.05 momentum=0.9 weight-decay=0.01 max-grad-norm=0.5"
VARIANT_CONFIGS = [(2, 2, 2, 1, ""), (2, 2, 2, 2, "sequence-parallel=true zero1=true")]


@pytest.mark.parametrize("variant", ["llama-adamw", "gpt-sgd"])
@pytest.mark.parametrize("tp,pp,dp,chunks,extra", VARIANT_CONFIGS,
                         ids=ids(VARIANT_CONFIGS))
def test_variants_match_single_rank(tmp_path_factory, tmp_path, variant, tp, pp,
                                    dp, chunks, extra):
    cache = _VARIANTS.setdefault(variant, None)
    if cache is None:
        cfg, opt = (LLAMA, OPT) if variant == "llama-adamw" else (CFG, SGD)
        cache = _VARIANTS[variant] = prepare(tmp_path_factory.mktemp(variant), cfg, opt)
    d, model, weights, ref, opt = cache
    plan, micro = layout_plan(tmp_path, model, tp, pp, dp, chunks, extra, opt)
    got = train(plan, tmp_path, tp * pp * dp, "local", weights)
    worst = check(ref, got, dp, micro)
    print(f"{variant} tp{tp} pp{pp} dp{dp} chunks{chunks} {extra}: worst relative "
          f"loss difference {worst:.2e}")


_VARIANTS = {}

"""Expert parallelism (--mapp-train-pipeline ep=, docs/expert-parallel.md):
an MoE GPT with its experts split over the ep group (inside dp), tokens
dispatched and combined by variable all-to-alls, reproduces the one-rank
(ep=1) loss curve within 1e-5 relative over 10 AdamW steps, with equal
expert_tokens, over the thread world and mpi: ep=2 and ep=4 alone (dp=ep:
every expert gradient stays on its rank), ep=2 inside dp=4 (the expert
gradients are averaged over the edp group), and ep=2 with tp=2 or pp=2.
Capacity-factor and dropless configs, aux and z losses on. The dp ranks
run fewer microbatches each so every layout sees the one rank's
microbatches (capacity and aux loss are per microbatch, as in Megatron).

Every step's gradient norm is compared too (within 1e-5): AdamW is nearly
blind to a gradient's scale, the norm is not. test_broken_sync_fails checks
that the comparison catches a wrong expert gradient: the 1/ep scale of the
edp sync left out, or the expert gradients averaged over dp instead of edp."""
import json
import re
import shutil
import sys

import pytest

from conftest import ROOT, require_tool
from train_harness import CORPUS, run

STEPS = 10
TOLERANCE = 1e-5
BASE = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 16,
        "vocab_size": 256, "micro_batch_size": 2, "num_moe_experts": 4,
        "moe_router_topk": 2, "moe_aux_loss_coeff": 1e-2, "moe_z_loss_coeff": 1e-3}
CONFIGS = {"capacity": {**BASE, "moe_capacity_factor": 1.0}, "dropless": BASE}
OPT = "optimizer=adamw lr=1e-3"
LAYOUTS = {  # name: (pipeline options, ranks); one rank runs 4 microbatches
    "ep2": ("tp=1 pp=1 dp=2 ep=2 microbatches=2", 2),
    "ep4": ("tp=1 pp=1 dp=4 ep=4 microbatches=1", 4),
    "ep2-dp4": ("tp=1 pp=1 dp=4 ep=2 microbatches=1", 4),
    "ep2-tp2": ("tp=2 pp=1 dp=2 ep=2 microbatches=2", 4),
    "ep2-pp2": ("tp=1 pp=2 dp=2 ep=2 microbatches=2", 4),
}
WORST = {}  # (config, layout, comm) -> worst relative loss difference


def _plan(tmp, name, options, edit=None):
    run([require_tool("mapp-opt"), tmp / "m.mlir", f"--mapp-train-pipeline={options} {OPT}",
         "-o", tmp / f"{name}.mlir"])
    if edit:
        text = (tmp / f"{name}.mlir").read_text()
        broken = edit(text)
        assert broken != text, "the edit did not apply"
        (tmp / f"{name}.mlir").write_text(broken)
    run([require_tool("mapp-translate"), "--mapp-to-plan", tmp / f"{name}.mlir",
         "-o", tmp / f"{name}.mplan"])
    return tmp / f"{name}.mplan"


def _train(tmp, plan, name, comm="local", ranks=1):
    metrics = tmp / f"{name}.jsonl"
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", STEPS, "--seed", 11,
            "--weights", tmp / "w.safetensors", "--metrics", metrics, "--quiet",
            "--threads", 1]
    if comm == "mpi":
        run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", ranks,
             require_tool("mapp-run"), *args, "--comm=mpi"])
    else:
        run([require_tool("mapp-run"), *args, "--comm=local"])
    return [json.loads(l) for l in metrics.read_text().splitlines()]


def _worst(got, ref, key="loss"):
    assert len(got) == len(ref) == STEPS
    return max(abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(got, ref))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def reference(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"moe-ep-{request.param}")
    (tmp / "cfg.json").write_text(json.dumps(CONFIGS[request.param]))
    env = {"PYTHONPATH": f"{ROOT}/python", "PATH": "/usr/bin:/bin"}
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT", "--config",
         tmp / "cfg.json", "-o", tmp / "m.mlir", "--weights", tmp / "w.safetensors",
         "--seed", 3], env=env)
    ref = _train(tmp, _plan(tmp, "ref", "tp=1 pp=1 dp=1 microbatches=4"), "ref")
    return request.param, tmp, ref


@pytest.mark.parametrize("comm", ["local", "mpi"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_ep_matches_one_rank(reference, layout, comm):
    if comm == "mpi" and not shutil.which("mpirun"):
        pytest.skip("no mpirun")
    config, tmp, ref = reference
    options, ranks = LAYOUTS[layout]
    plan = _plan(tmp, layout, options)
    # The plan really is expert parallel: dispatch/combine, sharded experts.
    ir = (tmp / f"{layout}.mlir").read_text()
    assert ir.count("mapp.ep_dispatch") >= 2 and ir.count("mapp.ep_combine") >= 2
    ep = int(re.search(r"ep=(\d+)", options).group(1))
    assert f"tensor<{4 // ep}x32x128xf32>" in ir
    got = _train(tmp, plan, f"{layout}-{comm}", comm, ranks)
    for step, (a, b) in enumerate(zip(got, ref)):
        err = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        assert err <= TOLERANCE, f"step {step}: {a['loss']} vs {b['loss']} ({err:.2e})"
    # The global gradient norm counts every expert shard once (AdamW is
    # nearly blind to a gradient's scale; the norm is not).
    assert _worst(got, ref, "grad_norm") <= TOLERANCE
    WORST[(config, layout, comm)] = _worst(got, ref)
    print(f"worst relative loss difference {config} {layout} {comm}: "
          f"{WORST[(config, layout, comm)]:.2e}")
    assert ref[-1]["loss"] < ref[0]["loss"]
    assert [a["expert_tokens"] for a in got] == [b["expert_tokens"] for b in ref]
    assert len(ref[0]["expert_tokens"]) == 2
    if config == "capacity":  # choices were really dropped
        kept = sum(sum(v) for v in ref[0]["expert_tokens"].values())
        assert kept < 2 * 4 * 2 * 16 * 2


@pytest.mark.parametrize("edit,layout", [
    # Expert gradients averaged over edp without Megatron's further 1/ep.
    (lambda ir: re.sub(r"factor = [0-9.e+-]+( : f64, mapp.name = \"[^\"]*ep_grad_scale)",
                       r"factor = 1.000000e+00\1", ir), "ep2-dp4"),
    # Expert gradients averaged over the whole dp group instead of edp.
    (lambda ir: ir.replace('group = "edp"', 'group = "dp"'), "ep2-dp4"),
], ids=["no-ep-scale", "edp-as-dp"])
def test_broken_sync_fails(reference, edit, layout):
    config, tmp, ref = reference
    if config != "dropless":
        pytest.skip("one config is enough")
    options, ranks = LAYOUTS[layout]
    plan = _plan(tmp, f"{layout}-broken", options, edit)
    got = _train(tmp, plan, f"{layout}-broken", "local", ranks)
    # AdamW normalizes a gradient's scale away (only eps sees it), so the
    # scale bug shows in the gradient norm; the wrong group in both.
    assert max(_worst(got, ref), _worst(got, ref, "grad_norm")) > TOLERANCE

"""--mapp-recompute end to end on the CPU (fp32): the rewritten plans train
with losses, gradient norms and final parameters bit-identical to the plan
without recomputation (same kernels on the same inputs), for one rank and
for tp=2 pp=2 through --mapp-train-pipeline; and the runtime allocates
exactly the smaller memory plan (the CPU backend's own count of allocated
bytes, printed by --report-memory, against the plan's mapp.memory record),
while the stash shrinks by the bytes the pass reports it dropped.
"""
import json
import os
import pathlib
import re
import subprocess

import pytest
import sys

from conftest import ROOT, read_st, require_tool

CORPUS = pathlib.Path(ROOT) / "data" / "gpt" / "news-1k.jsonl"
CFG = {"variant": "gpt", "num_layers": 4, "hidden_size": 32,
       "num_attention_heads": 4, "seq_length": 16, "vocab_size": 256,
       "micro_batch_size": 2, "tie_embeddings": True}
STEPS = 6


def run(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0, f"{cmd[0]} failed ({r.returncode}):\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recompute")
    (tmp / "cfg.json").write_text(json.dumps(CFG))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", tmp / "cfg.json", "-o", tmp / "model.mlir",
         "--weights", tmp / "init.safetensors", "--seed", 7])
    return tmp


def compile_plan(model, name, passes):
    mlir = model / f"{name}.mlir"
    run([require_tool("mapp-opt"), model / "model.mlir", *passes, "-mapp-plan-memory",
         "-o", mlir])
    run([require_tool("mapp-translate"), "--mapp-to-plan", mlir, "-o", model / f"{name}.mplan"])
    text = mlir.read_text()
    memory = {}
    for entry in re.findall(r"\{arena_bytes = [^}]*\}", text):
        fields = dict(re.findall(r"(\w+) = (\d+) : i64", entry))
        memory[int(fields["stage"])] = {k: int(v) for k, v in fields.items()}
    rc = re.search(r"mapp\.recompute = \{([^}]*)\}", text)
    counts = dict(re.findall(r"(\w+) = (\d+) : i64", rc.group(1))) if rc else {}
    return model / f"{name}.mplan", memory, {k: int(v) for k, v in counts.items()}


def train(model, plan, tag, world=1):
    m, w = model / f"{tag}.jsonl", model / f"{tag}.safetensors"
    r = run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", STEPS, "--seed", 11, "--weights", model / "init.safetensors",
             "--metrics", m, "--save", w, "--quiet", "--threads", 1,
             "--comm=local", "--report-memory"])
    allocated = {int(a): (int(b), int(c)) for a, b, c in re.findall(
        r"rank (\d+) memory: allocated (\d+) B \(peak \d+ B\); plan .* = (\d+) B",
        r.stderr)}
    assert len(allocated) == world, r.stderr
    rows = [json.loads(l) for l in m.read_text().splitlines()]
    return rows, read_st(w), allocated


def same_training(a, b):
    assert len(a[0]) == STEPS
    assert [r["loss"] for r in a[0]] == [r["loss"] for r in b[0]]
    assert [r["grad_norm"] for r in a[0]] == [r["grad_norm"] for r in b[0]]
    assert a[1] == b[1]


def check_allocation(runs, memory, stage_of):
    """Each rank allocates its stage's planned peak, byte for byte."""
    for rank, (allocated, _) in runs[2].items():
        assert allocated == memory[stage_of(rank)]["peak_bytes"], (rank, allocated)


@pytest.mark.parametrize("policy", ["selective", "full", "activations"])
def test_single_rank_identical_and_smaller(model, policy):
    base = ["-mapp-autodiff"]
    opt = ["-mapp-optimizer=lr=1e-3"]
    plain_plan, plain_mem, _ = compile_plan(model, "plain", base + opt)
    rc_plan, rc_mem, counts = compile_plan(
        model, policy, base + [f"--mapp-recompute=policy={policy} layers=all"] + opt)
    plain, rc = train(model, plain_plan, "plain"), train(model, rc_plan, policy)
    same_training(plain, rc)
    check_allocation(plain, plain_mem, lambda r: 0)
    check_allocation(rc, rc_mem, lambda r: 0)
    # The stash shrinks by what the pass dropped minus what it saved instead
    # (every tensor here is a multiple of the 64-byte plan alignment).
    assert counts["dropped"] >= {"selective": 2, "full": 10, "activations": 2}[policy]
    if policy == "activations":  # the pre-activation was saved already
        assert counts["added"] == 0
    saved = counts["dropped_bytes"] - counts["added_bytes"]
    assert plain_mem[0]["stash_bytes"] - rc_mem[0]["stash_bytes"] == saved
    assert rc_mem[0]["arena_bytes"] < plain_mem[0]["arena_bytes"]
    # What the runtime saves is what the plan said it would.
    assert plain[2][0][0] - rc[2][0][0] == \
        plain_mem[0]["peak_bytes"] - rc_mem[0]["peak_bytes"] > 0


@pytest.mark.parametrize("policy,layers", [("selective", "all"), ("full", "all"),
                                           ("full", "3"), ("activations", "all")])
def test_tp2_pp2_identical_and_smaller(model, policy, layers):
    pipe = "--mapp-train-pipeline=tp=2 pp=2 microbatches=2 schedule=1f1b lr=1e-3"
    plain_plan, plain_mem, _ = compile_plan(model, "pp-plain", [pipe])
    rc_plan, rc_mem, counts = compile_plan(
        model, f"pp-{policy}-{layers}",
        [f"{pipe} recompute={policy} recompute-layers={layers}"])
    plain = train(model, plain_plan, "pp-plain", world=4)
    rc = train(model, rc_plan, f"pp-{policy}-{layers}", world=4)
    same_training(plain, rc)
    stage_of = lambda rank: rank // 2  # Megatron order, dp = 1: tp fastest
    check_allocation(plain, plain_mem, stage_of)
    check_allocation(rc, rc_mem, stage_of)
    assert counts["dropped"] > 0
    # Stages holding a recomputed layer shrink; the others are untouched.
    touched = {1} if layers == "3" else {0, 1}  # layers 0-1 | 2-3
    for s in (0, 1):
        if s in touched:
            assert rc_mem[s]["stash_bytes"] < plain_mem[s]["stash_bytes"], s
            assert rc_mem[s]["peak_bytes"] < plain_mem[s]["peak_bytes"], s
        else:
            assert rc_mem[s] == plain_mem[s], s
    for rank in range(4):
        assert plain[2][rank][0] - rc[2][rank][0] == \
            plain_mem[stage_of(rank)]["peak_bytes"] - rc_mem[stage_of(rank)]["peak_bytes"]


# Other schedules and layouts: zero-bubble (the recomputing backward split
# into Bi and W), interleaved virtual stages, sequence parallelism, dp.
@pytest.mark.parametrize("extra,world", [
    ("tp=2 pp=2 microbatches=2 schedule=zb-h1", 4),
    ("pp=2 chunks=2 microbatches=4 schedule=interleaved", 2),
    ("tp=2 sequence-parallel=true", 2),
    ("dp=2 microbatches=2", 2)], ids=["zb-h1", "interleaved", "sp", "dp2"])
def test_schedules_identical(model, extra, world):
    pipe = f"--mapp-train-pipeline={extra} lr=1e-3"
    tag = extra.split()[-1].replace("=", "")
    plain_plan, plain_mem, _ = compile_plan(model, f"s-plain-{tag}", [pipe])
    rc_plan, rc_mem, _ = compile_plan(model, f"s-full-{tag}", [f"{pipe} recompute=full"])
    plain = train(model, plain_plan, f"s-plain-{tag}", world=world)
    rc = train(model, rc_plan, f"s-full-{tag}", world=world)
    same_training(plain, rc)
    for s in rc_mem:
        assert rc_mem[s]["stash_bytes"] < plain_mem[s]["stash_bytes"], s

"""mapp-sim's memory of split (MegaFBD) plans against what the runtime
allocates.

Each layout's plan runs one step under mapp-run --report-memory (the CPU
backend's own count of allocated bytes per rank); mapp-sim --json predicts
each rank's peak. A forward rank holds its parameters and one arena slot
(its outputs leave as sends; it stashes nothing for a backward), so the
prediction must equal the allocation exactly; so must a backward rank's
at pp = 1 (one slot, one microbatch in flight). At pp = 2 a backward rank
of stage 0 allocates an arena slot per microbatch in flight, of which the
prediction counts only the stashed activations: never more than the
allocation. The step-end parameter copy is the fp32 parameter count of
each forward rank times its backward peers' share (docs/megafbd.md).
"""
import json
import re

import pytest

from conftest import require_tool
from test_parallel_e2e import CFG, CORPUS, MBS, OPT, export, run, to_plan

# (pp, fwd-tp, bwd-tp, transfer)
LAYOUTS = [(1, 1, 2, "recompute"), (1, 1, 2, "activations"),
           (2, 1, 2, "recompute"), (2, 2, 2, "activations")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("fbdsim")
    weights = d / "init.safetensors"
    return export(d, CFG, MBS, weights), weights


def param_count(cfg):
    h, v, s, n = (cfg["hidden_size"], cfg["vocab_size"], cfg["seq_length"],
                  cfg["num_layers"])
    # Per layer: two layer norms, qkv, proj, fc1 (4h), fc2; tied embeddings.
    layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) \
        + (4 * h * h + h)
    return v * h + s * h + n * layer + 2 * h


@pytest.mark.parametrize("pp,fwd_tp,bwd_tp,transfer", LAYOUTS,
                         ids=[f"pp{p}-fwd{f}-bwd{b}-{t}" for p, f, b, t in LAYOUTS])
def test_sim_memory_matches_runtime(model, tmp_path, pp, fwd_tp, bwd_tp, transfer):
    mlir, weights = model
    pipeline = (f"--mapp-train-pipeline=tp={bwd_tp} pp={pp} microbatches=4 "
                f"schedule=1f1b {OPT} fbd=true fwd-tp={fwd_tp} transfer={transfer}")
    plan = to_plan(tmp_path, mlir, [pipeline], "fbd")
    world = (fwd_tp + bwd_tp) * pp
    r = run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", 1, "--seed", 11, "--weights", weights, "--quiet",
             "--threads", 1, "--comm=local", "--report-memory"])
    allocated = {int(a): int(b) for a, b in re.findall(
        r"rank (\d+) memory: allocated (\d+) B", r.stderr)}
    assert len(allocated) == world, r.stderr
    sim = json.loads(run([require_tool("mapp-sim"), plan, "--json"]).stdout)[0]
    assert len(sim["roles"]) == world
    for rank, (role, peak) in enumerate(zip(sim["roles"], sim["peak_bytes"])):
        if role == "fwd" or pp == 1:
            assert peak == allocated[rank], (rank, role, peak, allocated)
        else:
            assert peak <= allocated[rank], (rank, role, peak, allocated)
        if role == "fwd":
            assert sim["peak_in_flight"][rank] == 1
    # Every forward rank of a stage gets the whole stage's parameters; at
    # pp = 1 the stage is the whole model.
    if pp == 1:
        assert sim["param_copy_bytes"] == 4 * param_count(CFG) * fwd_tp

"""MegaFBD end-to-end: --mapp-train-pipeline fbd=true → plan → mapp-run.

The GPT and the single-rank reference of test_parallel_e2e.py (20 AdamW
steps on the whole global batch as one microbatch). Each split layout —
pp ∈ {1, 2}, forward and backward tensor-parallel degrees (fwd-tp ≠ bwd-tp
in both transfer modes; activations are resharded between degrees), over
--comm=local and --comm=mpi — must give every step's loss and grad norm
within 1e-5 relative of the reference and the same final parameters: the
forward ranks compute with the parameters the backward ranks updated the
step before (docs/megafbd.md). Then the bad-input paths: a placement on a
device that does not exist, the wrong number of MPI processes.
"""
import re
import subprocess

import pytest

from conftest import require_tool
from test_parallel_e2e import (CFG, CORPUS, GLOBAL_ROWS, MBS, MPIRUN, OPT, check, prepare,
                               to_plan, train)

MICRO = GLOBAL_ROWS // MBS
DATA = ["--data", CORPUS, "--tokenizer", "bytes"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("fbd"), CFG, OPT)


def fbd_plan(d, model, pp, fwd_tp, bwd_tp, transfer, extra=""):
    pipeline = (f"--mapp-train-pipeline=tp={bwd_tp} pp={pp} microbatches={MICRO} "
                f"schedule=1f1b {OPT} fbd=true fwd-tp={fwd_tp} transfer={transfer} {extra}")
    name = f"fbd-pp{pp}-f{fwd_tp}-b{bwd_tp}-{transfer}"
    return to_plan(d, model, [pipeline], name), (fwd_tp + bwd_tp) * pp


# (pp, fwd-tp, bwd-tp, transfer)
CONFIGS = [(1, 1, 2, "recompute"), (1, 2, 2, "activations"), (2, 1, 2, "recompute"),
           (2, 2, 1, "recompute"), (2, 1, 1, "activations"),
           # Saved activations resharded between degrees (docs/megafbd.md,
           # "Resharding"): forward pieces sliced for a finer backward side,
           # concatenated for a coarser one.
           (1, 1, 2, "activations"), (1, 2, 1, "activations"),
           (2, 1, 2, "activations"), (2, 2, 1, "activations")]
MPI_CONFIGS = [(2, 1, 2, "recompute"), (2, 2, 2, "activations"),
               (2, 1, 2, "activations"), (1, 2, 1, "activations")]


def ids(cs):
    return [f"pp{p}-fwd{f}-bwd{b}-{t}" for p, f, b, t in cs]


@pytest.mark.parametrize("pp,fwd_tp,bwd_tp,transfer", CONFIGS, ids=ids(CONFIGS))
def test_local_matches_single_rank(setup, tmp_path, pp, fwd_tp, bwd_tp, transfer):
    d, model, weights, ref, opt = setup
    plan, world = fbd_plan(tmp_path, model, pp, fwd_tp, bwd_tp, transfer)
    got = train(plan, tmp_path, world, "local", weights)
    worst = check(ref, got, 1, MICRO)
    print(f"fbd pp{pp} fwd-tp{fwd_tp} bwd-tp{bwd_tp} {transfer}: worst {worst:.2e}")


def have_mpi():
    if MPIRUN is None:
        return False
    r = subprocess.run([require_tool("mapp-run"), "--help"], capture_output=True, text=True)
    return "built with communicators: local, mpi" in r.stdout


@pytest.mark.parametrize("pp,fwd_tp,bwd_tp,transfer", MPI_CONFIGS, ids=ids(MPI_CONFIGS))
def test_mpi_matches_single_rank(setup, tmp_path, pp, fwd_tp, bwd_tp, transfer):
    if not have_mpi():
        pytest.skip("no mpirun or mapp-run built without MPI")
    d, model, weights, ref, opt = setup
    plan, world = fbd_plan(tmp_path, model, pp, fwd_tp, bwd_tp, transfer)
    got = train(plan, tmp_path, world, "mpi", weights)
    worst = check(ref, got, 1, MICRO)
    print(f"mpi fbd pp{pp} fwd-tp{fwd_tp} bwd-tp{bwd_tp} {transfer}: worst {worst:.2e}")


def slots_per_rank(plan, world):
    r = subprocess.run([require_tool("mapp-run"), plan, *DATA, "--steps", "1", "--comm=local",
                        "--report-memory", "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = dict(re.findall(r"rank (\d+) memory: .* \+ (\d+) slot\(s\)", r.stderr))
    return [int(got[str(k)]) for k in range(world)]


def test_recompute_holds_one_microbatch(setup, tmp_path):
    """transfer=recompute runs each backward rank's forward right before its
    backward: one activation slot per backward rank, where 1F1B (and the
    split with transfer=activations) holds p - r on stage r (closed form)."""
    d, model, weights, ref, opt = setup
    pp = 2
    for transfer, want_bwd in (("recompute", [1, 1]), ("activations", [pp - r for r in range(pp)])):
        plan, world = fbd_plan(tmp_path, model, pp, 1, 1, transfer)
        slots = slots_per_rank(plan, world)
        assert slots[:pp] == want_bwd, (transfer, slots)
        assert slots[pp:] == [1] * pp, (transfer, slots)  # forward ranks


def test_placement_table_printed(setup, tmp_path):
    d, model, weights, ref, opt = setup
    plan, world = fbd_plan(tmp_path, model, 2, 1, 2, "recompute")
    r = subprocess.run([require_tool("mapp-run"), plan, *DATA, "--steps", "1", "--comm=local"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [l.split() for l in r.stdout.splitlines() if l[:4].strip().isdigit()]
    # rank role stage dp tp device peer: 4 backward ranks, then 2 forward.
    assert [(x[0], x[1], x[2], x[4]) for x in rows] == [
        ("0", "bwd", "0", "0"), ("1", "bwd", "0", "1"), ("2", "bwd", "1", "0"),
        ("3", "bwd", "1", "1"), ("4", "fwd", "0", "0"), ("5", "fwd", "1", "0")]
    assert [x[6] for x in rows] == ["4", "4", "5", "5", "0", "2"]


def test_bad_placements(setup, tmp_path):
    d, model, weights, ref, opt = setup
    cases = [
        # A GPU that does not exist: on a GPU machine rank 2 on cuda:7 fails
        # ("device 7 does not exist"); without a GPU the first CUDA rank.
        ("fwd-device=cuda fwd-index=7 bwd-device=cuda", "placement of rank "),
        ("bwd-index=3", "placement of rank 0 on cpu:3: no such device"),
        ("fwd-device=cuda", "the plan places ranks on both cpu and cuda: run them as processes"),
    ]
    for extra, want in cases:
        plan, world = fbd_plan(tmp_path, model, 1, 1, 2, "recompute", extra)
        r = subprocess.run([require_tool("mapp-run"), plan, *DATA, "--steps", "1", "--comm=local"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert want in r.stderr, r.stderr
        if "cuda:7" in extra:
            assert ("cuda:7: --backend=cuda: device 7 does not exist" in r.stderr
                    or "no usable CUDA device" in r.stderr
                    or "built without the CUDA backend" in r.stderr), r.stderr


def test_nccl_refused(setup, tmp_path):
    d, model, weights, ref, opt = setup
    plan, world = fbd_plan(tmp_path, model, 1, 1, 2, "recompute")
    r = subprocess.run([require_tool("mapp-run"), plan, *DATA, "--steps", "1", "--comm=nccl",
                        "--backend=cuda"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "MegaFBD plans run over --comm=local or --comm=mpi, not nccl" in r.stderr, r.stderr


def test_wrong_process_count(setup, tmp_path):
    if not have_mpi():
        pytest.skip("no mpirun or mapp-run built without MPI")
    d, model, weights, ref, opt = setup
    plan, world = fbd_plan(tmp_path, model, 1, 1, 2, "recompute")
    r = subprocess.run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
                        require_tool("mapp-run"), plan, *DATA, "--steps", "1", "--comm=mpi"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "plan is for world_size 3 but mpirun started 2 process(es)" in r.stderr
    assert "a split plan: 2 backward + 1 forward ranks" in r.stderr

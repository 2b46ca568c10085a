"""Multi-rank runtime end-to-end (no PyTorch needed).

The hand-built MLP of runtime/test/TestPlans.cpp split over tp x pp x dp
ranks (parallelMlpPlan: column/row-parallel linears with tp all-reduces,
1F1B or interleaved pipelines with send/recv, dp gradient all-reduce) must
reproduce the single-rank run of the same global batch — loss and grad_norm
within 1e-5 relative for 20 steps, final parameters gathered by --save, the
batches every dp rank used — with the thread world (--comm=local) and with
one MPI process per rank (--comm=mpi). Then the failure paths and trace
sampling. MegaScan's diagnosis of real runs: test_scan_comm_parity.py.

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, else $MAPP_BIN or
build/bin.
"""
import json
import re
import os
import pathlib
import shutil
import struct
import subprocess

import pytest

from conftest import read_st, find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]


MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
MPIRUN = shutil.which("mpirun")
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"
pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                                reason="mapp-run / mapp-make-test-plan not built")

MODEL = ["vocab=256", "hidden=16", "ffn=24", "batch=2", "seq=16",
         "optimizer=adamw", "lr=0.01", "max_grad_norm=0.5"]
GLOBAL_MB = 4  # microbatches of the global batch (dp * per-rank)
STEPS = 20


def run(args, check=True, timeout=300):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{args[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def mpi_has_comm():
    r = run([MAPP_RUN, "--help"])
    return "built with communicators: local, mpi" in r.stdout


def make_plan(path, tp=1, pp=1, dp=1, chunks=1, extra=()):
    args = [MAKE_PLAN, path, *MODEL, f"microbatches={GLOBAL_MB // dp}",
            f"tp={tp}", f"pp={pp}", f"dp={dp}", f"chunks={chunks}", *extra]
    run(args)


def train(plan, out, world, comm, steps=STEPS, extra=()):
    metrics, save, dump = out / "m.jsonl", out / "w.safetensors", out / "b.jsonl"
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
            "--seed", 3, "--metrics", metrics, "--save", save,
            "--dump-batches", dump, "--quiet", *extra]
    if comm == "mpi":
        run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", world,
             MAPP_RUN, *args, "--comm=mpi"])
    else:
        run([MAPP_RUN, *args, "--comm=local", "--threads", 1])
    return ([json.loads(l) for l in metrics.read_text().splitlines()],
            read_st(save), [json.loads(l) for l in dump.read_text().splitlines()])


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    make_plan(d / "ref.mplan")
    return train(d / "ref.mplan", d, 1, "local")


CONFIGS = [(tp, pp, dp, 1) for tp in (1, 2) for pp in (1, 2) for dp in (1, 2)
           if tp * pp * dp > 1] + [(1, 2, 1, 2), (2, 2, 2, 2)]


def check_against(reference, got, dp):
    ref_m, ref_w, ref_b = reference
    m, w, b = got
    assert len(m) == STEPS
    for x, y in zip(m, ref_m):
        assert rel(x["loss"], y["loss"]) < 1e-5, (x, y)
        assert rel(x["grad_norm"], y["grad_norm"]) < 1e-5, (x, y)
        assert x["tokens"] == y["tokens"]
    assert w.keys() == ref_w.keys()
    for name, (shape, vals) in ref_w.items():
        assert w[name][0] == shape, name
        err = max(abs(p - q) for p, q in zip(w[name][1], vals))
        assert err < 1e-5 * max(1.0, max(abs(q) for q in vals)), (name, err)
    # Every dp rank's microbatch m is the single-rank run's microbatch
    # dp_rank * (GLOBAL_MB / dp) + m (contiguous shards of the global batch).
    per = GLOBAL_MB // dp
    ref = {(r["step"], r["microbatch"]): r for r in ref_b}
    assert len(b) == len(ref_b)
    for r in b:
        want = ref[(r["step"], r["dp_rank"] * per + r["microbatch"])]
        assert r["tokens"] == want["tokens"] and r["targets"] == want["targets"]


@pytest.mark.parametrize("tp,pp,dp,chunks", CONFIGS,
                         ids=[f"tp{a}-pp{b}-dp{c}-ch{d}" for a, b, c, d in CONFIGS])
def test_local_matches_single_rank(tmp_path, reference, tp, pp, dp, chunks):
    make_plan(tmp_path / "p.mplan", tp, pp, dp, chunks)
    check_against(reference, train(tmp_path / "p.mplan", tmp_path, tp * pp * dp, "local"), dp)


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
@pytest.mark.parametrize("tp,pp,dp,chunks", CONFIGS,
                         ids=[f"tp{a}-pp{b}-dp{c}-ch{d}" for a, b, c, d in CONFIGS])
def test_mpi_matches_single_rank(tmp_path, reference, tp, pp, dp, chunks):
    if not mpi_has_comm():
        pytest.skip("mapp-run built without MPI")
    make_plan(tmp_path / "p.mplan", tp, pp, dp, chunks)
    check_against(reference, train(tmp_path / "p.mplan", tmp_path, tp * pp * dp, "mpi"), dp)


def test_prints_rank_coordinates(tmp_path):
    make_plan(tmp_path / "p.mplan", tp=2, pp=2, dp=2)
    r = run([MAPP_RUN, tmp_path / "p.mplan", "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", 1, "--threads", 1])
    assert "rank 5 = (dp 0, pp 1, tp 1) of world 8 (tp 2, dp 2, pp 2)" in r.stdout


def threads_per_rank(stdout):
    return sorted(int(m) for m in re.findall(r"(\d+) CPU thread\(s\)", stdout))


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_mpi_ranks_share_the_hosts_cores(tmp_path):
    """Four processes on one host take a quarter of its cores each (at least
    one), as four rank threads of one process do; --threads overrides."""
    if not mpi_has_comm():
        pytest.skip("mapp-run built without MPI")
    make_plan(tmp_path / "p.mplan", pp=2, dp=2)
    base = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", 4, MAPP_RUN,
            tmp_path / "p.mplan", "--data", CORPUS, "--tokenizer", "bytes",
            "--steps", 1, "--comm=mpi"]
    share = max(1, os.cpu_count() // 4)
    assert threads_per_rank(run(base).stdout) == [share] * 4
    assert threads_per_rank(run(base + ["--threads", 3]).stdout) == [3] * 4
    local = run([MAPP_RUN, *base[6:-1]]).stdout
    assert threads_per_rank(local) == [share] * 4


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_mpi_world_size_mismatch_is_a_clear_error(tmp_path):
    if not mpi_has_comm():
        pytest.skip("mapp-run built without MPI")
    make_plan(tmp_path / "p.mplan", pp=2, dp=2)
    r = run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", 2, MAPP_RUN,
             tmp_path / "p.mplan", "--comm=mpi", "--data", CORPUS, "--tokenizer",
             "bytes", "--quiet"], check=False, timeout=120)
    assert r.returncode != 0
    assert "plan is for world_size 4 but mpirun started 2 process(es)" in r.stderr


def test_bad_inject_and_comm_flags(tmp_path):
    make_plan(tmp_path / "p.mplan", dp=2)
    base = [MAPP_RUN, tmp_path / "p.mplan", "--data", CORPUS, "--tokenizer", "bytes"]
    r = run([*base, "--inject", "slow-compute:rank=1"], check=False)
    assert r.returncode == 2 and "needs factor=" in r.stderr
    r = run([*base, "--inject", "slow-compute:rank=9,factor=2"], check=False)
    assert r.returncode == 1 and "rank 9 is outside the plan's world of 2" in r.stderr
    r = run([*base, "--comm=nccl"], check=False)
    assert r.returncode == 2 and "--comm=nccl needs --backend=cuda" in r.stderr
    # With cuda: not built, or (NCCL built, no GPU here) no device for the
    # world's two ranks; never a hang or a crash.
    r = run([*base, "--comm=nccl", "--backend=cuda", "--steps", "1"], check=False)
    assert r.returncode == 1, r.stderr
    assert any(m in r.stderr for m in (
        "--comm=nccl is not built", "--backend=cuda is not built",
        "no CUDA device is visible", "use --comm=local")), r.stderr


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_mpi_ranks_with_different_plans(tmp_path):
    """Two MPI processes given different plans of one layout (another
    learning rate) used to train silently, each with its own; now every
    rank fails before step 1 naming rank 1 and both plan checksums."""
    if not mpi_has_comm():
        pytest.skip("mapp-run built without MPI")
    make_plan(tmp_path / "a.mplan", dp=2)
    make_plan(tmp_path / "b.mplan", dp=2, extra=["lr=0.02"])
    tail = ["--comm=mpi", "--data", CORPUS, "--tokenizer", "bytes",
            "--steps", 2, "--quiet"]
    r = run([MPIRUN, "--allow-run-as-root", "--oversubscribe",
             "-np", 1, MAPP_RUN, tmp_path / "a.mplan", *tail, ":",
             "-np", 1, MAPP_RUN, tmp_path / "b.mplan", *tail], check=False)
    assert r.returncode != 0, r.stdout
    assert re.search(r"rank 1 loaded another plan \(checksum 0x[0-9a-f]{8}\) "
                     r"than rank 0 \(0x[0-9a-f]{8}\)", r.stderr), r.stderr


LAUNCHER_VARS = ("OMPI_COMM_WORLD_RANK", "RANK", "SLURM_PROCID", "MAPP_LAUNCHER")


def test_nccl_launcher_errors(tmp_path):
    """--comm=nccl under a launcher (docs/multi-gpu.md): a broken launcher
    environment and a world that is not the plan's fail before step 1,
    naming the variable or both world sizes (no GPU needed)."""
    usage = run([MAPP_RUN, "--help"], check=False).stdout
    if "nccl" not in usage.split("built with communicators:")[-1]:
        pytest.skip("mapp-run built without NCCL")
    make_plan(tmp_path / "p.mplan", dp=2)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}

    def nccl(**launcher):
        return subprocess.run(
            [MAPP_RUN, str(tmp_path / "p.mplan"), "--data", str(CORPUS),
             "--tokenizer", "bytes", "--backend=cuda", "--comm=nccl",
             "--steps", "1"],
            capture_output=True, text=True, timeout=120,
            env={**env, **launcher})

    torchrun = dict(RANK="1", WORLD_SIZE="4", LOCAL_RANK="1",
                    LOCAL_WORLD_SIZE="4", MASTER_PORT="29500")
    r = nccl(**torchrun)
    assert r.returncode == 1, r.stderr
    assert ("the plan is for world_size 2 but torchrun started 4 "
            "process(es)") in r.stderr, r.stderr
    del torchrun["LOCAL_WORLD_SIZE"]
    r = nccl(**torchrun)
    assert r.returncode == 1 and \
        "torchrun launcher: LOCAL_WORLD_SIZE is not set" in r.stderr, r.stderr
    r = nccl(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="0",
             SLURM_STEP_TASKS_PER_NODE="2", MAPP_LAUNCHER="torchrun")
    assert r.returncode == 1 and "torchrun launcher: RANK is not set" in r.stderr
    if MPIRUN and mpi_has_comm():
        # Two NCCL processes under mpirun: each names itself and its missing
        # GPU (none here; one on a one-GPU machine), mpirun ends the job;
        # with two GPUs they train, the id over MPI.
        r = subprocess.run(
            [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2",
             MAPP_RUN, str(tmp_path / "p.mplan"), "--data", str(CORPUS),
             "--tokenizer", "bytes", "--backend=cuda", "--comm=nccl",
             "--steps", "1"],
            capture_output=True, text=True, timeout=120, env=env)
        if r.returncode == 0:
            assert "NCCL processes (mpi): 2 rank(s)" in r.stderr, r.stderr
            return
        assert re.search(r"mapp-run: rank [01]: --comm=nccl: (no CUDA device is "
                         r"visible to local rank [01]|2 processes on this node "
                         r"but 1 visible GPU)", r.stderr), r.stderr


def trace_events(d, rank):
    lines = (d / f"rank-{rank}.trace.jsonl").read_text().splitlines()
    recs = [json.loads(l) for l in lines]
    assert recs[0]["type"] == "header" and recs[-1]["type"] == "footer"
    return [r for r in recs if "type" not in r], recs


def test_trace_regions_and_sampling(tmp_path):
    make_plan(tmp_path / "p.mplan", tp=2, pp=2,
              extra=["trace=1", "trace_every=3", "trace_window=1"])
    run([MAPP_RUN, tmp_path / "p.mplan", "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", 6, "--quiet", "--trace-dir", tmp_path / "tr", "--threads", 1])
    for rank in range(4):
        ev, recs = trace_events(tmp_path / "tr", rank)
        assert recs[0]["rank"] == rank and recs[0]["world"] == 4
        assert {e["step"] for e in ev} == {0, 3}
        cats = {e["cat"] for e in ev}
        assert {"compute", "comm", "optimizer"} <= cats
        for e in ev:
            assert e["e"] >= e["b"]
            if e.get("op") in ("send", "recv"):
                assert "peer" in e and "tag" in e and e["bytes"] > 0
            if e.get("op") == "all_reduce":
                assert "group" in e and "seq" in e
        if rank in (0, 1):  # first stage: reads tokens
            assert "data" in cats
    # tp peers number their all-reduces alike.
    seqs = [[(e["name"], e["step"], e["mb"], e["seq"])
             for e in trace_events(tmp_path / "tr", r)[0]
             if e.get("op") == "all_reduce" and e["name"] != "step.metrics"]
            for r in (2, 3)]
    assert seqs[0] == seqs[1] and seqs[0]


def test_trace_sample_flag_overrides_the_plan(tmp_path):
    # Same plan (sampling 3:1 compiled in), traced steps chosen at run time;
    # the traced steps' events are those of the plan's own sampling.
    make_plan(tmp_path / "p.mplan", tp=2,
              extra=["trace=1", "trace_every=3", "trace_window=1"])
    base = [MAPP_RUN, tmp_path / "p.mplan", "--data", CORPUS, "--tokenizer",
            "bytes", "--steps", 6, "--quiet", "--threads", 1]
    by_flag = {}
    for sample, want in (("2:1", {0, 2, 4}), ("0:1", set(range(6))),
                         ("3:2", {0, 1, 3, 4}), ("1:0", set())):
        d = tmp_path / ("tr" + sample.replace(":", "_"))
        run(base + ["--trace-dir", d, "--trace-sample", sample])
        ev, _ = trace_events(d, 0)
        assert {e["step"] for e in ev} == want, sample
        by_flag[sample] = ev
    run(base + ["--trace-dir", tmp_path / "plan"])
    plan_ev, _ = trace_events(tmp_path / "plan", 0)
    key = lambda e: (e["name"], e["cat"], e.get("mb"), e.get("op"), e.get("seq"))
    assert sorted(map(key, (e for e in by_flag["0:1"] if e["step"] == 3))) == \
        sorted(map(key, (e for e in plan_ev if e["step"] == 3)))
    for bad, msg in (("2", "EVERY:WINDOW"), ("x:1", "--trace-sample EVERY"),
                     ("2:-1", "--trace-sample WINDOW")):
        r = run(base + ["--trace-dir", tmp_path / "bad", "--trace-sample", bad],
                check=False)
        assert r.returncode == 2 and msg in r.stderr, (bad, r.stderr)
    r = run(base + ["--trace-sample", "2:1"], check=False)
    assert r.returncode == 2 and "needs --trace-dir" in r.stderr, r.stderr

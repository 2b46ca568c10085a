"""The uneven data-parallel split (docs/elastic.md, "Uneven data-parallel
split"): --dp-split K0,K1,... runs Kd of the step's dp x M microbatches on
replica d, and --dp-balance N moves microbatches off a slow replica in
place.

Independent references: the even split of the same plan (the compiled task
table as it is) for the samples each step reads (--dump-batches, in the
global batch's order) and the losses (1e-5: the gradient sums change
order); an injected slow-compute with a known answer (rank 1 three times
as slow: its replica should hold a quarter of the microbatches, 2 of 8).

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, $MAPP_SCAN, else $MAPP_BIN or
build/bin.
"""
import hashlib
import json
import pathlib
import shutil
import subprocess

import pytest

from conftest import find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]
MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
MAPP_SCAN = find_tool("mapp-scan")
MPIRUN = shutil.which("mpirun")
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"
pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                                reason="mapp-run / mapp-make-test-plan not built")


def run(args, check=True, timeout=300):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{args[0]} failed ({r.returncode}):\n{r.stderr}")
    return r


def jsonl(path):
    return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def close(a, b, tol=1e-5):
    return abs(a - b) <= tol * max(abs(b), 1e-30)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for name, tp, pp, dp, mb, size in (
            ("dp2", 1, 1, 2, 4, ["hidden=16", "ffn=24", "seq=16"]),
            ("dp4", 1, 1, 4, 2, ["hidden=16", "ffn=24", "seq=16"]),
            ("tp2dp2", 2, 1, 2, 4, ["hidden=16", "ffn=24", "seq=16"]),
            ("pp2dp2", 1, 2, 2, 4, ["hidden=16", "ffn=24", "seq=16"]),
            ("dp1", 1, 1, 1, 8, ["hidden=16", "ffn=24", "seq=16"]),
            # Enough compute per microbatch for the balancer to measure.
            ("big", 1, 1, 2, 4, ["hidden=64", "ffn=256", "seq=32"])):
        run([MAKE_PLAN, d / f"{name}.mplan", "vocab=256", "batch=2",
             "optimizer=adamw", "lr=0.01", "max_grad_norm=0.5", *size,
             f"microbatches={mb}", f"tp={tp}", f"pp={pp}", f"dp={dp}"])
        out[name] = d / f"{name}.mplan"
    return out


def train(plan, steps, out, extra=()):
    m, dump = out / "m.jsonl", out / "d.jsonl"
    r = run([MAPP_RUN, plan, "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", steps, "--seed", 3, "--quiet", "--threads", 1,
             "--metrics", m, "--dump-batches", dump, *extra])
    return jsonl(m), jsonl(dump), r


def global_batches(dump):
    """step -> a digest of its rows in the global batch's order (replica,
    microbatch, row), and the (replica, microbatch) pairs each step held."""
    by = {}
    for d in dump:
        by.setdefault(d["step"], []).append(d)
    rows, held = {}, {}
    for step, ds in by.items():
        ds.sort(key=lambda d: (d["dp_rank"], d["microbatch"]))
        rows[step] = hashlib.sha256(json.dumps(
            [row for d in ds for row in d["tokens"]]).encode()).hexdigest()
        held[step] = [(d["dp_rank"], d["microbatch"]) for d in ds]
    return rows, held


@pytest.mark.parametrize("plan,split", [
    ("dp2", "3,5"), ("dp2", "7,1"), ("dp2", "1,7"),
    ("dp4", "1,3,2,2"), ("tp2dp2", "5,3")])
def test_uneven_split_reads_the_same_batch_and_gradient(tmp_path, plans, plan,
                                                        split):
    """Every step reads the even split's samples, in the same global order,
    and trains to the same losses: the loss is seeded 1/M per microbatch
    and the gradients averaged over dp, so the split does not weigh."""
    even, uneven = tmp_path / "even", tmp_path / "uneven"
    even.mkdir(), uneven.mkdir()
    want, want_dump, _ = train(plans[plan], 6, even)
    got, got_dump, _ = train(plans[plan], 6, uneven, ["--dp-split", split])
    want_rows, _ = global_batches(want_dump)
    got_rows, held = global_batches(got_dump)
    assert got_rows == want_rows
    counts = [int(k) for k in split.split(",")]
    assert held[0] == [(d, k) for d, n in enumerate(counts) for k in range(n)]
    for g, w in zip(got, want):
        assert close(g["loss"], w["loss"]), (g, w)
        assert close(g["grad_norm"], w["grad_norm"], 1e-4), (g, w)
    assert [x["step"] for x in got] == list(range(6))


def test_uneven_split_over_mpi_processes(tmp_path, plans):
    """The same over two MPI processes: the samples and the losses of the
    even split over rank threads."""
    r = run([MAPP_RUN, "--help"])
    if MPIRUN is None or "built with communicators: local, mpi" not in r.stdout:
        pytest.skip("mpirun or mapp-run's MPI communicator missing")
    want, _, _ = train(plans["dp2"], 6, tmp_path)
    m = tmp_path / "mpi.jsonl"
    run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", 2, MAPP_RUN,
         plans["dp2"], "--comm=mpi", "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", 6, "--seed", 3, "--quiet", "--threads", 1, "--metrics", m,
         "--dp-split", "6,2"])
    for g, w in zip(jsonl(m), want):
        assert close(g["loss"], w["loss"]), (g, w)


def test_balance_away_from_a_slow_replica_and_back(tmp_path, plans):
    """dp=2, 8 microbatches a step; rank 1 three times as slow in steps
    0-29 of 100, --dp-balance 10: its replica is given a quarter of the
    microbatches (2 of 8: 3 x 2 = 6 = 1 x 6) at step 10 (or 20), in place,
    and all 8 are even again once the fault is over (from step 40 on; a
    busy host's noise may stop at 5,3 first or take a window more).
    Each switch's gain measured in the window after it; the losses those of
    the run without the fault (1e-5)."""
    out = tmp_path / "run"
    out.mkdir()
    mon = tmp_path / "mon.jsonl"
    got, _, r = train(plans["big"], 100, out, [
        "--dp-balance", 10, "--monitor", mon,
        "--inject", "slow-compute:rank=1,factor=3,from-step=0,to-step=30"])
    ds = [j for j in jsonl(mon) if j.get("event") == "elastic"]
    stayed = [(d["step"], [round(t, 2) for t in d["evidence"]["replica_ms"]],
               d["evidence"].get("microbatches_weighed"),
               round(d["evidence"].get("predicted_gain", 0), 2),
               d["evidence"].get("votes"))
              for d in ds if d["decision"] == "dp-split-window"]
    splits = [(d["step"], d["evidence"]["microbatches_next"]) for d in ds
              if d["decision"] == "dp-split"]
    assert splits and splits[0][0] in (10, 20), (splits, r.stderr)
    assert splits[0][1][1] < splits[0][1][0] and \
        abs(splits[0][1][1] - 2) <= 1, (splits, r.stderr)
    back = next((i for i, s in enumerate(splits) if s[1] == [4, 4]), None)
    assert back is not None and splits[back][0] in range(40, 100, 10), \
        (splits, stayed, r.stderr)
    assert splits[0][1] != [4, 4]
    measured = [d for d in ds if d["decision"] == "dp-split-measured"]
    assert measured and measured[0]["microbatches"] == splits[0][1]
    assert measured[0]["measured_gain"] >= 1.05, (measured, r.stderr)
    assert "elastic: dp split at step" in r.stderr
    assert [x["step"] for x in got] == list(range(100))
    ref = tmp_path / "ref"
    ref.mkdir()
    want, _, _ = train(plans["big"], 100, ref)
    for g, w in zip(got, want):
        assert close(g["loss"], w["loss"]), (g, w)
    if MAPP_SCAN is not None:  # MegaScan's report lists the decisions
        traces = tmp_path / "traces"
        run([MAPP_RUN, plans["big"], "--data", CORPUS, "--tokenizer", "bytes",
             "--steps", 2, "--quiet", "--trace-dir", traces])
        r = run([MAPP_SCAN, traces, "--decisions", mon])
        first = next(d for d in ds if d["decision"] == "dp-split")["evidence"]
        assert (f"elastic: dp-split at step {splits[0][0]}: microbatches "
                f"[4,4] -> {json.dumps(splits[0][1], separators=(',', ':'))}, "
                f"predicted gain {first['predicted_gain']:.2f}x") in r.stdout, \
            r.stdout
        if stayed:  # a window that stayed, with its replica times
            w = next(d for d in ds if d["decision"] == "dp-split-window")
            assert (f"elastic: dp-split-window at step {w['step']}: stays on "
                    + json.dumps(w["evidence"]["microbatches_now"],
                                 separators=(",", ":")) + ", replica ms "
                    + " ".join(f"{t:.2f}" for t in w["evidence"]["replica_ms"])
                    ) in r.stdout, r.stdout


@pytest.mark.parametrize("plan,flags,message", [
    ("pp2dp2", ["--dp-split", "3,5"], "--dp-split needs a plan without pipeline stages (pp = 1; this one has pp = 2"),
    ("dp1", ["--dp-balance", "10"], "the plan has dp = 1"),
    ("dp2", ["--dp-split", "3,4"], "--dp-split: 2 count(s) summing to 7; the plan needs 2 (one per replica) summing to 8"),
    ("dp2", ["--dp-split", "4,4,0"], "expected microbatch counts >= 1"),
    ("dp2", ["--dp-split", "3,x"], "expected microbatch counts >= 1"),
    ("dp2", ["--dp-balance", "1"], "--dp-balance needs an integer in [2,"),
    ("dp2", ["--dp-balance", "5", "--trace-dir", "t"], "leave out --trace-dir"),
    ("dp2", ["--dp-split", "3,5", "--elastic", "--save-dir", "c"], "not --elastic or under mapp-launch"),
    ("dp2", ["--dp-balance", "5", "--elastic-attempt", "0"], "not --elastic or under mapp-launch"),
])
def test_bad_split_flags(tmp_path, plans, plan, flags, message):
    r = run([MAPP_RUN, plans[plan], "--steps", 2, *flags], check=False)
    assert r.returncode in (1, 2) and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr

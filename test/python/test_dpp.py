"""MegaDPP end to end: the run-time scheduler on compiled GPT plans.

A GPT (8 layers, hidden 32) is compiled with --mapp-train-pipeline for
pp=4 with 8 microbatches and for tp=2·pp=2·dp=2 under every schedule (1f1b,
gpipe, zb-h1 at chunks=1; dfc, bfc, adaptive at chunks=2); each trains 20
steps over --comm=local and --comm=mpi (skipped without mpirun / an MPI
build), and every step's loss and grad norm must match the single-rank run
within 1e-5 relative (test_parallel_e2e's check). mapp-adaptive-plan's
adaptive plans (bench/dpp's) must match too. Under a
link delay the adaptive run must switch to bfc (stderr names the switch and
its reason) and still match; its reported peak in-flight stash must stay
under --mem-cap; a cap below one microbatch's activations is an error.
"""
import re
import shutil

import pytest

import test_parallel_e2e as pe
from conftest import require_tool

STEPS = pe.STEPS
CFG = dict(pe.CFG, num_layers=8)
MBS = 1
ROWS = 8  # global batch rows: 8 microbatches of 1 (pp4) / 2 x 2 dp (tp2pp2dp2)


def mpi_ok():
    if shutil.which("mpirun") is None:
        return False
    r = pe.run([require_tool("mapp-run"), "--help"])
    return "built with communicators: local, mpi" in r.stdout


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpp")
    weights = d / "init.safetensors"
    model = pe.export(d, dict(CFG, micro_batch_size=MBS), MBS, weights)
    ref_model = pe.export(d, CFG, ROWS)
    plan = pe.to_plan(d, ref_model, ["-mapp-autodiff", f"-mapp-optimizer={pe.OPT}"], "ref")
    (d / "ref").mkdir()
    old = pe.MBS
    pe.MBS = MBS
    try:
        ref = pe.train(plan, d / "ref", 1, "local", weights)
    finally:
        pe.MBS = old
    return d, model, weights, ref


def plans(d, model, tp, pp, dp, chunks):
    micro = ROWS // (MBS * dp)
    name = f"tp{tp}pp{pp}dp{dp}c{chunks}"
    pipeline = (f"--mapp-train-pipeline=tp={tp} pp={pp} dp={dp} chunks={chunks} "
                f"microbatches={micro} schedule=interleaved {pe.OPT}")
    static = pe.to_plan(d, model, [pipeline], name)
    adaptive = d / f"{name}-adaptive.mplan"
    pe.run([require_tool("mapp-adaptive-plan"), static, adaptive])
    return static, adaptive, micro


def train(plan, out, world, comm, weights, extra=()):
    """pe.train plus extra flags; returns (metrics, batches, weights, stderr)."""
    out.mkdir(parents=True, exist_ok=True)
    metrics, dump, save = out / "m.jsonl", out / "b.jsonl", out / "w.safetensors"
    args = [plan, "--data", pe.CORPUS, "--tokenizer", "bytes", "--steps", STEPS,
            "--seed", 11, "--weights", weights, "--metrics", metrics,
            "--dump-batches", dump, "--save", save, "--threads", 1, *extra]
    if comm == "mpi":
        r = pe.run([shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe",
                    "-np", world, require_tool("mapp-run"), *args, "--comm=mpi"])
    else:
        r = pe.run([require_tool("mapp-run"), *args, "--comm=local"])
    import json
    from conftest import read_st
    return ([json.loads(l) for l in metrics.read_text().splitlines()],
            [json.loads(l) for l in dump.read_text().splitlines()],
            read_st(save)), r.stderr


def check(ref, got, dp, micro):
    old = pe.MBS
    pe.MBS = MBS
    try:
        return pe.check(ref, got, dp, micro)
    finally:
        pe.MBS = old


def peaks(stderr):
    return [(int(a), int(b)) for a, b in re.findall(
        r"scheduler adaptive: peak stash (\d+) bytes \(cap (\d+)", stderr)]


LAYOUTS = [(1, 4, 1, 2), (2, 2, 2, 2)]
# Every schedule the compiler generates: the one-chunk tables at chunks=1,
# the interleaved family (dfc = group p, bfc = group m; with m = 8 / 4 no
# other group divides m) and adaptive at chunks=2.
SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("dfc", 2), ("bfc", 2),
             ("adaptive", 2)]


@pytest.mark.parametrize("comm", ["local", "mpi"])
@pytest.mark.parametrize("schedule,chunks", SCHEDULES, ids=[s for s, _ in SCHEDULES])
@pytest.mark.parametrize("tp,pp,dp", [l[:3] for l in LAYOUTS],
                         ids=[f"tp{a}pp{b}dp{c}" for a, b, c, _ in LAYOUTS])
def test_every_schedule_matches_single_rank(gpt, tmp_path, comm, tp, pp, dp,
                                            schedule, chunks):
    """20 steps under each compiled schedule, every step's loss and grad norm
    within 1e-5 relative of the single-rank run."""
    if comm == "mpi" and not mpi_ok():
        pytest.skip("no mpirun, or mapp-run built without MPI")
    d, model, weights, ref = gpt
    micro = ROWS // (MBS * dp)
    pipeline = (f"--mapp-train-pipeline=tp={tp} pp={pp} dp={dp} chunks={chunks} "
                f"microbatches={micro} schedule={schedule} {pe.OPT}")
    plan = pe.to_plan(tmp_path, model, [pipeline], schedule)
    world = tp * pp * dp
    got, err = train(plan, tmp_path / "run", world, comm, weights)
    check(ref, got, dp, micro)
    if schedule == "adaptive":
        assert len(peaks(err)) == world, err


@pytest.mark.parametrize("comm", ["local", "mpi"])
@pytest.mark.parametrize("tp,pp,dp,chunks", LAYOUTS,
                         ids=[f"tp{a}pp{b}dp{c}ch{e}" for a, b, c, e in LAYOUTS])
def test_tool_made_adaptive_plans_match_single_rank(gpt, tmp_path, comm, tp, pp, dp,
                                                    chunks):
    """mapp-adaptive-plan's plans (the bench's: bfc as the looped order of the
    dfc tasks, stash = arena / chunks) train as the single rank does."""
    if comm == "mpi" and not mpi_ok():
        pytest.skip("no mpirun, or mapp-run built without MPI")
    d, model, weights, ref = gpt
    _, adaptive, micro = plans(tmp_path, model, tp, pp, dp, chunks)
    world = tp * pp * dp
    got, err = train(adaptive, tmp_path / "adaptive", world, comm, weights)
    check(ref, got, dp, micro)
    assert len(peaks(err)) == world, err


def memory_remarks(model, pipeline):
    """Per stage (peak, persistent, slots, arena) from -mapp-plan-memory."""
    r = pe.run([require_tool("mapp-opt"), model, pipeline, "-mapp-plan-memory",
                "-o", "/dev/null"])
    return [tuple(map(int, m)) for m in re.findall(
        r"memory plan, stage \d+: peak (\d+) B .*?= persistent (\d+) B \+ "
        r"(\d+) slot\(s\) x arena (\d+) B", r.stderr)]


def test_compiled_mem_cap_bounds_the_arena(gpt, tmp_path):
    """schedule=adaptive mem-cap=C: each stage's arena slots shrink to what C
    holds (persistent + slots x arena <= C, never below the dfc table's),
    and the scheduler, admitting microbatches only into free slots, still
    trains as one rank does under a slow link (breadth-first pressing on
    the slots)."""
    d, model, weights, ref = gpt
    base = (f"--mapp-train-pipeline=pp=2 chunks=2 microbatches={ROWS} "
            f"schedule=adaptive {pe.OPT}")
    free = memory_remarks(model, base)
    dfc = memory_remarks(model, base.replace("schedule=adaptive", "schedule=dfc"))
    assert all(s == ROWS for _, _, s, _ in free), free
    # One slot more than the dfc table needs on the stage that needs most.
    cap = max(p + (s + 1) * a for (_, p, s, a) in dfc)
    capped = memory_remarks(model, f"{base} mem-cap={cap}")
    for (peak, _, slots, _), (_, _, need, _) in zip(capped, dfc):
        assert peak <= cap and need <= slots < ROWS, (capped, dfc, cap)
    plan = pe.to_plan(tmp_path, model, [f"{base} mem-cap={cap}"], "capped")
    fault = "link-delay:src=1,dst=0,us=20000,from-step=2"
    got, err = train(plan, tmp_path / "run", 2, "local", weights,
                     ["--inject", fault])
    check(ref, got, 1, ROWS)
    assert "scheduler dfc -> bfc" in err, err
    # Below what dfc needs: a located error naming the figures.
    r = pe.subprocess.run([str(require_tool("mapp-opt")), str(model),
                           f"{base} mem-cap={min(p for _, p, _, _ in dfc)}",
                           "-mapp-plan-memory", "-o", "/dev/null"],
                          capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "is below what the dfc table needs on stage" in r.stderr, r.stderr


def test_slow_link_switches_and_matches(gpt, tmp_path):
    d, model, weights, ref = gpt
    static, adaptive, micro = plans(tmp_path, model, 1, 4, 1, 2)
    # Stage 1 -> stage 0 (backward gradients into the first stage) slowed in
    # steps 5..14, so the run also sees the link recover.
    fault = "link-delay:src=1,dst=0,us=20000,from-step=5,to-step=15"
    got, err = train(adaptive, tmp_path / "slow", 4, "local", weights,
                     ["--inject", fault])
    check(ref, got, 1, micro)
    switches = re.findall(r"rank 0 step (\d+): scheduler dfc -> bfc \(([^)]*)\)", err)
    assert switches, err
    step, reason = switches[0]
    assert int(step) >= 5, err
    assert "link 1->0 slow" in reason and "best" in reason, reason
    back = re.findall(r"rank 0 step (\d+): scheduler bfc -> dfc \(no link is slow\)", err)
    assert back and int(back[-1]) >= 15, err
    # Only rank 0 receives on 1 -> 0; the stages upstream follow it from
    # the next step on (the pipeline's verdict, shared at step start).
    for r in (1, 2, 3):
        up = re.findall(rf"^mapp-run: rank {r} step (\d+): scheduler dfc -> bfc \((.*)\)$",
                        err, re.M)
        assert up, (r, err)
        assert int(up[0][0]) >= int(step), (r, up, step)
        assert "a link of this pipeline is slow (1 stage(s)" in up[0][1], up


def test_monitor_verdicts_drive_the_scheduler(gpt, tmp_path):
    """--monitor-to-dpp: with the scheduler's own link estimate switched off
    (slow_link_ratio 1e9: no transit is ever 1e9x its best), only the live
    monitor's slow-link verdict on 1 -> 0 can move the pipeline to bfc, and
    its `recovered` verdict back; without the flag nothing switches."""
    d, model, weights, ref = gpt
    static, _, micro = plans(tmp_path, model, 1, 4, 1, 2)
    deaf = tmp_path / "deaf-adaptive.mplan"
    pe.run([require_tool("mapp-adaptive-plan"), static, deaf, "ratio=1e9"])
    fault = "link-delay:src=1,dst=0,us=20000,from-step=5,to-step=15"
    alerts = tmp_path / "alerts.jsonl"
    got, err = train(deaf, tmp_path / "fed", 4, "local", weights,
                     ["--inject", fault, "--monitor", alerts, "--monitor-to-dpp"])
    check(ref, got, 1, micro)
    import json
    a = [json.loads(l) for l in alerts.read_text().splitlines()]
    slow = [x for x in a if x["kind"] == "slow-link"]
    assert [(x["src"], x["dst"]) for x in slow] == [(1, 0)], a
    switches = re.findall(r"rank 0 step (\d+): scheduler dfc -> bfc \(([^)]*)\)", err)
    assert switches, err
    step, reason = switches[0]
    assert "link 1->0 slow by the live monitor's verdict" in reason, reason
    # Acted on after the monitor saw it (its alert is about an earlier step).
    assert int(step) > slow[0]["step"], (step, slow)
    back = re.findall(r"rank 0 step (\d+): scheduler bfc -> dfc", err)
    rec = [x for x in a if x["kind"] == "recovered"]
    assert rec and back and int(back[-1]) > rec[0]["step"], (back, rec, err)
    # The same run without the flag: the deaf scheduler never switches.
    got, err = train(deaf, tmp_path / "unfed", 4, "local", weights,
                     ["--inject", fault, "--monitor", tmp_path / "a2.jsonl"])
    check(ref, got, 1, micro)
    assert "scheduler dfc -> bfc" not in err, err


def test_mem_cap_is_kept_and_too_small_a_cap_is_an_error(gpt, tmp_path):
    d, model, weights, ref = gpt
    static, adaptive, micro = plans(tmp_path, model, 1, 4, 1, 2)
    fault = "link-delay:src=1,dst=0,us=20000"
    # Learn the stash size from an uncapped run, then cap at 3 microbatches.
    _, err = train(adaptive, tmp_path / "free", 4, "local", weights,
                   ["--inject", fault])
    stash = int(re.search(r"stash (\d+) per chunk", err).group(1))
    cap = 3 * 2 * stash
    got, err = train(adaptive, tmp_path / "capped", 4, "local", weights,
                     ["--inject", fault, "--mem-cap", str(cap)])
    check(ref, got, 1, micro)
    pk = peaks(err)
    assert len(pk) == 4 and all(c == cap and p <= cap for p, c in pk), err
    assert max(p for p, _ in pk) > 0
    r = pe.subprocess.run([str(require_tool("mapp-run")), str(adaptive), "--data", str(pe.CORPUS),
                           "--tokenizer", "bytes", "--steps", "1", "--weights", str(weights),
                           "--mem-cap", str(2 * stash - 1), "--threads", "1"],
                          capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "below one microbatch's activations" in r.stderr, r.stderr

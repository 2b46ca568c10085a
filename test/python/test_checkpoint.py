"""Whole-state checkpoints (docs/checkpoints.md) and non-finite steps.

Independent references: the uninterrupted run of the same plan and flags
(bit-identical losses and final parameters after 10 steps + --resume + 10
steps, one rank and tp=2 x pp=2 x dp=2 over local threads and MPI), the
single-rank run for a resume into another layout (1e-5), a save killed
halfway by an injected stall (the previous checkpoint still resumes
exactly), corrupted/truncated/missing/mismatched checkpoints (errors that
name the shard and the problem), and an injected NaN at a known op (the run
stops naming it, writes no checkpoint of the bad step).

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, else $MAPP_BIN or build/bin.
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import zlib

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
GLOBAL_MB = 4


def run(args, check=True, timeout=300, env=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{args[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def mpi_has_comm():
    return "built with communicators: local, mpi" in run([MAPP_RUN, "--help"]).stdout


def make_plan(path, tp=1, pp=1, dp=1, extra=()):
    run([MAKE_PLAN, path, *MODEL, f"microbatches={GLOBAL_MB // dp}",
         f"tp={tp}", f"pp={pp}", f"dp={dp}", *extra])
    return path


def train_args(plan, steps, metrics, extra=()):
    return [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
            "--seed", 3, "--metrics", metrics, "--quiet", *extra]


def train(plan, steps, metrics, extra=(), comm="local", world=1, check=True,
          env=None):
    args = train_args(plan, steps, metrics, extra)
    if comm == "mpi":
        return run([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np",
                    world, MAPP_RUN, *args, "--comm=mpi", "--threads", 1],
                   check=check, env=env)
    return run([MAPP_RUN, *args, "--comm=local", "--threads", 1], check=check,
               env=env)


def metrics(path):
    return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines()]


def resume_matches(tmp_path, plan, comm="local", world=1):
    """20 straight steps vs 10 + --resume + 10: identical numbers."""
    a, b1, b2 = tmp_path / "a.jsonl", tmp_path / "b1.jsonl", tmp_path / "b2.jsonl"
    ck = tmp_path / "ck"
    train(plan, 20, a, ["--save", tmp_path / "a.safetensors"], comm, world)
    train(plan, 10, b1, ["--save-dir", ck], comm, world)
    assert (ck / "step-00000010" / "manifest.json").exists()
    train(plan, 20, b2, ["--resume", ck, "--save", tmp_path / "b.safetensors"],
          comm, world)
    ma, mb = metrics(a), metrics(b1) + metrics(b2)
    assert [m["step"] for m in metrics(b2)] == list(range(10, 20))
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb]
    assert [m["grad_norm"] for m in ma] == [m["grad_norm"] for m in mb]
    pa, pb = read_st(tmp_path / "a.safetensors"), read_st(tmp_path / "b.safetensors")
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k] == pb[k], k


def test_resume_one_rank_bit_identical(tmp_path):
    resume_matches(tmp_path, make_plan(tmp_path / "p.mplan"))


def test_resume_tp2_pp2_dp2_local_bit_identical(tmp_path):
    resume_matches(tmp_path, make_plan(tmp_path / "p.mplan", 2, 2, 2))


def test_resume_tp2_pp2_dp2_mpi_bit_identical(tmp_path):
    if MPIRUN is None or not mpi_has_comm():
        pytest.skip("mpirun or mapp-run's MPI communicator missing")
    resume_matches(tmp_path, make_plan(tmp_path / "p.mplan", 2, 2, 2), "mpi", 8)


def test_manifest_describes_shards(tmp_path):
    plan = make_plan(tmp_path / "p.mplan", 2, 1, 2)
    ck = tmp_path / "ck"
    train(plan, 2, tmp_path / "m.jsonl", ["--save-dir", ck])
    m = json.loads((ck / "step-00000002" / "manifest.json").read_text())
    assert m["step"] == 2 and m["layout"]["tp"] == 2 and m["layout"]["dp"] == 2
    assert len(m["shards"]) == 4
    for s in m["shards"]:
        f = ck / "step-00000002" / s["file"]
        assert f.stat().st_size == s["bytes"]
        st = read_st(f)
        assert {t["name"] for t in s["tensors"]} == set(st)
        for t in s["tensors"]:
            assert list(st[t["name"]][0]) == t["shape"]
    names = {t["name"] for s in m["shards"] for t in s["tensors"]}
    assert "fc.weight.exp_avg" in names and "fc.weight.exp_avg_sq" in names
    assert m["data"]["samples_consumed"] == 2 * GLOBAL_MB * 2


@pytest.mark.parametrize("src,dst", [((2, 2, 2), (1, 1, 1)),
                                     ((1, 1, 1), (2, 2, 2)),
                                     ((2, 1, 2), (1, 2, 1))])
def test_resume_into_another_layout(tmp_path, src, dst):
    ref = make_plan(tmp_path / "ref.mplan")
    a = tmp_path / "a.jsonl"
    train(ref, 14, a)
    ck = tmp_path / "ck"
    train(make_plan(tmp_path / "src.mplan", *src), 8, tmp_path / "b1.jsonl",
          ["--save-dir", ck])
    b2 = tmp_path / "b2.jsonl"
    train(make_plan(tmp_path / "dst.mplan", *dst), 14, b2, ["--resume", ck])
    got, want = metrics(b2), metrics(a)[8:]
    assert [m["step"] for m in got] == list(range(8, 14))
    for g, w in zip(got, want):
        assert abs(g["loss"] - w["loss"]) <= 1e-5 * abs(w["loss"])
        assert abs(g["grad_norm"] - w["grad_norm"]) <= 1e-5 * abs(w["grad_norm"]) + 1e-7


def test_elastic_restart_dp2_to_dp1(tmp_path):
    """dp=2 saves every 2 steps; one rank dies (MPI: its process is killed;
    local threads: the process); --resume with dp=1 continues from the newest
    checkpoint and matches the uninterrupted run."""
    plan2 = make_plan(tmp_path / "dp2.mplan", dp=2)
    ck = tmp_path / "ck"
    args = train_args(plan2, 100000, tmp_path / "m.jsonl",
                      ["--save-dir", ck, "--save-every", 2, "--threads", 1])
    use_mpi = MPIRUN is not None and mpi_has_comm()
    cmd = ([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", 2,
            MAPP_RUN, *args, "--comm=mpi"] if use_mpi
           else [MAPP_RUN, *args, "--comm=local"])
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        # Any finished checkpoint past step 4: a step takes milliseconds and
        # only the newest --save-keep (3) are kept, so a poll for one step's
        # folder can miss it (it failed so on CI's 2 cores).
        def saved():
            return [d for d in ck.glob("step-*") if not d.name.endswith(".tmp")
                    and int(d.name[5:]) >= 4 and (d / "manifest.json").exists()]
        deadline = time.time() + 120
        while not saved():
            assert p.poll() is None and time.time() < deadline, "no checkpoint"
            time.sleep(0.01)
        victim = p.pid
        if use_mpi:  # rank 1's own process
            for k in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                    text=True).stdout.split():
                env = pathlib.Path(f"/proc/{k}/environ").read_bytes()
                if b"OMPI_COMM_WORLD_RANK=1\0" in env:
                    victim = int(k)
        os.kill(victim, signal.SIGKILL)
        p.wait(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    newest = max(int(d.name[5:]) for d in ck.iterdir()
                 if d.name.startswith("step-") and not d.name.endswith(".tmp"))
    plan1 = make_plan(tmp_path / "dp1.mplan", dp=1)
    total = newest + 4
    ref, got = tmp_path / "ref.jsonl", tmp_path / "got.jsonl"
    train(plan1, total, ref)
    train(plan1, total, got, ["--resume", ck])
    g, w = metrics(got), metrics(ref)[newest:]
    assert [m["step"] for m in g] == list(range(newest, total))
    for x, y in zip(g, w):
        assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(y["loss"])


def test_kill_during_save_keeps_previous(tmp_path):
    plan = make_plan(tmp_path / "p.mplan")
    ck, marker = tmp_path / "ck", tmp_path / "stalled"
    env = dict(os.environ,
               MAPP_TEST_STALL_WRITE=f"step-00000006.*.tmp/rank-00000:{marker}")
    args = train_args(plan, 10, tmp_path / "m.jsonl",
                      ["--save-dir", ck, "--save-every", 3, "--threads", 1])
    p = subprocess.Popen([str(a) for a in [MAPP_RUN, *args]], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert p.poll() is None and time.time() < deadline, "never stalled"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)  # halfway through step 6's shard
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    tmp, = ck.glob("step-00000006.*.tmp")  # named by the killed run's id
    partial = [f for f in tmp.iterdir() if f.name != "mapp-owner.json"]
    assert partial and all(".tmp-" in f.name for f in partial)
    assert not (ck / "step-00000006").exists()
    # The previous checkpoint resumes exactly.
    ref, got = tmp_path / "ref.jsonl", tmp_path / "got.jsonl"
    train(plan, 8, ref)
    train(plan, 8, got, ["--resume", ck, "--save-dir", ck])
    assert metrics(got) == [dict(m, tokens_per_s=g["tokens_per_s"], step_ms=g["step_ms"])
                            for m, g in zip(metrics(ref)[3:], metrics(got))]
    # The killed job's leftover: same plan, its process gone: removed.
    assert not list(ck.glob("step-00000006.*.tmp"))
    assert (ck / "step-00000008" / "manifest.json").exists()


def test_kill_during_plain_save_keeps_previous_file(tmp_path):
    """--save FILE (issue 17): a kill mid-write leaves the old file whole."""
    plan = make_plan(tmp_path / "p.mplan")
    out, marker = tmp_path / "w.safetensors", tmp_path / "stalled"
    train(plan, 2, tmp_path / "m.jsonl", ["--save", out])
    before = out.read_bytes()
    env = dict(os.environ, MAPP_TEST_STALL_WRITE=f"w.safetensors:{marker}")
    p = subprocess.Popen([str(a) for a in [MAPP_RUN, *train_args(
        plan, 3, tmp_path / "m2.jsonl", ["--save", out])]], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert p.poll() is None and time.time() < deadline, "never stalled"
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert out.read_bytes() == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_step_saves_exits_0(tmp_path, sig):
    plan = make_plan(tmp_path / "p.mplan")
    ck, m = tmp_path / "ck", tmp_path / "m.jsonl"
    p = subprocess.Popen([str(a) for a in [MAPP_RUN, *train_args(
        plan, 1000000, m, ["--save-dir", ck, "--threads", 1])]],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (m.exists() and len(m.read_text().splitlines()) >= 3):
        assert p.poll() is None and time.time() < deadline
        time.sleep(0.05)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    steps = len(metrics(m))
    man = json.loads((ck / f"step-{steps:08d}" / "manifest.json").read_text())
    assert man["step"] == steps


def make_checkpoint(tmp_path):
    plan = make_plan(tmp_path / "p.mplan", tp=2)
    ck = tmp_path / "ck"
    train(plan, 2, tmp_path / "m.jsonl", ["--save-dir", ck])
    return plan, ck / "step-00000002"


def resume_error(plan, ck, tmp_path, extra=()):
    r = train(plan, 4, tmp_path / "r.jsonl", ["--resume", ck, *extra], check=False)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr
    return r.stderr


def test_corrupt_shard_named(tmp_path):
    plan, ck = make_checkpoint(tmp_path)
    f = ck / "rank-00001.safetensors"
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x10
    f.write_bytes(bytes(b))
    err = resume_error(plan, ck, tmp_path)
    assert "rank-00001.safetensors" in err and "checksum mismatch" in err


def test_truncated_shard_named(tmp_path):
    plan, ck = make_checkpoint(tmp_path)
    f = ck / "rank-00000.safetensors"
    f.write_bytes(f.read_bytes()[:-7])
    err = resume_error(plan, ck, tmp_path)
    assert "rank-00000.safetensors" in err and "truncated" in err


def test_missing_shard_named(tmp_path):
    plan, ck = make_checkpoint(tmp_path)
    (ck / "rank-00001.safetensors").unlink()
    err = resume_error(plan, ck, tmp_path)
    assert "rank-00001.safetensors" in err and "missing" in err


def test_missing_shard_named_on_reshard(tmp_path):
    _, ck = make_checkpoint(tmp_path)
    (ck / "rank-00001.safetensors").unlink()
    err = resume_error(make_plan(tmp_path / "one.mplan"), ck, tmp_path)
    assert "rank-00001.safetensors" in err and "missing" in err


def test_other_model_named(tmp_path):
    _, ck = make_checkpoint(tmp_path)
    other = tmp_path / "o.mplan"
    run([MAKE_PLAN, other, *[a if not a.startswith("ffn=") else "ffn=32" for a in MODEL],
         f"microbatches={GLOBAL_MB}", "tp=2"])
    err = resume_error(other, ck, tmp_path)
    assert "does not match the plan" in err and "tensor 'fc." in err


def test_other_optimizer_named(tmp_path):
    _, ck = make_checkpoint(tmp_path)
    other = tmp_path / "o.mplan"
    run([MAKE_PLAN, other, *[a if not a.startswith("optimizer=") else "optimizer=sgd"
                             for a in MODEL], f"microbatches={GLOBAL_MB}", "tp=2"])
    err = resume_error(other, ck, tmp_path)
    assert "does not match the plan" in err


def test_bad_manifest_named(tmp_path):
    plan, ck = make_checkpoint(tmp_path)
    (ck / "manifest.json").write_text('{"format": "mapp-checkpoint", "vers')
    err = resume_error(plan, ck, tmp_path)
    assert "manifest.json" in err


def test_other_seed_named(tmp_path):
    plan, ck = make_checkpoint(tmp_path)
    r = run([MAPP_RUN, plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", 4,
             "--seed", 4, "--quiet", "--resume", ck], check=False)
    assert r.returncode != 0 and "--seed" in r.stderr


def test_no_checkpoint_in_folder(tmp_path):
    plan = make_plan(tmp_path / "p.mplan")
    (tmp_path / "empty").mkdir()
    err = resume_error(plan, tmp_path / "empty", tmp_path)
    assert "no checkpoint" in err


@pytest.mark.parametrize("layout", [(1, 1, 1), (2, 2, 2)])
def test_injected_nan_names_the_op(tmp_path, layout):
    """A NaN written by the first gelu at step 4 (steps count from 1, as the
    progress lines do): the run stops non-zero, names the op, and the newest
    checkpoint is the one before the NaN."""
    plan = make_plan(tmp_path / "p.mplan", *layout)
    ck, out = tmp_path / "ck", tmp_path / "w.safetensors"
    r = train(plan, 10, tmp_path / "m.jsonl",
              ["--save-dir", ck, "--save-every", 1, "--save", out,
               "--inject-nan", "4:gelu"], check=False)
    assert r.returncode != 0
    assert "non-finite" in r.stderr and "op 'gelu'" in r.stderr, r.stderr
    assert "step 4" in r.stderr
    assert len(metrics(tmp_path / "m.jsonl")) == 3
    assert sorted(d.name for d in ck.iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003"]
    assert not out.exists()


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_lr_1e6_stops_no_nan_checkpoint(tmp_path, optimizer):
    """lr=1e6 diverges within a few steps. The run must stop non-zero with a
    message (AdamW's exp_avg_sq overflows before the loss: the save of that
    state is refused; SGD: the loss goes non-finite, the op is named), and
    every checkpoint on disk holds finite values only."""
    plan = tmp_path / "p.mplan"
    run([MAKE_PLAN, plan, *[a for a in MODEL if not a.startswith(("lr=", "max_grad", "optimizer="))],
         "lr=1e6", f"optimizer={optimizer}", f"microbatches={GLOBAL_MB}"])
    ck = tmp_path / "ck"
    r = train(plan, 20, tmp_path / "m.jsonl",
              ["--save-dir", ck, "--save-every", 1, "--save-keep", 0,
               "--save", tmp_path / "w.safetensors"], check=False)
    assert r.returncode != 0
    assert "non-finite" in r.stderr, r.stderr
    if optimizer == "sgd":
        assert "op 'linear' (kernel linear)" in r.stderr, r.stderr
    assert not (tmp_path / "w.safetensors").exists()
    assert any(ck.iterdir())
    for d in ck.iterdir():
        if d.name.endswith(".tmp"):
            continue
        for name, (_, vals) in read_st(d / "rank-00000.safetensors").items():
            assert all(v == v and abs(v) != float("inf") for v in vals), (d, name)


def test_lr_1e6_without_save_dir_names_the_op(tmp_path):
    plan = tmp_path / "p.mplan"
    run([MAKE_PLAN, plan, *[a for a in MODEL if not a.startswith(("lr=", "max_grad"))],
         "lr=1e6", f"microbatches={GLOBAL_MB}"])
    r = train(plan, 20, tmp_path / "m.jsonl", ["--save", tmp_path / "w.safetensors"],
              check=False)
    assert r.returncode != 0
    assert "non-finite" in r.stderr and "op 'linear' (kernel linear)" in r.stderr, r.stderr
    assert not (tmp_path / "w.safetensors").exists()


# Loss scaling (--mapp-mixed-precision lowers to the attrs mapp-make-test-plan
# writes with loss_scale=...; test/Transforms/Train/mixed-precision.mlir
# checks the pass).

FP16_MAX = 65504.0


def scaled_plan(path, *opts, extra_model=()):
    run([MAKE_PLAN, path, *MODEL, *extra_model, f"microbatches={GLOBAL_MB}", *opts])
    return path


def test_static_power_of_two_scale_is_exact(tmp_path):
    """Scaling the seed by 2^10 and unscaling in the update is exact in fp32:
    the same losses, norms and parameters bit for bit."""
    plain = scaled_plan(tmp_path / "a.mplan")
    static = scaled_plan(tmp_path / "b.mplan", "loss_scale=static", "loss_scale_init=1024")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    train(plain, 6, a, ["--save", tmp_path / "a.st"])
    train(static, 6, b, ["--save", tmp_path / "b.st"])
    ma, mb = metrics(a), metrics(b)
    assert [m["loss"] for m in ma] == [m["loss"] for m in mb]
    assert [m["grad_norm"] for m in ma] == [m["grad_norm"] for m in mb]
    assert all(m["loss_scale"] == 1024 and not m["skipped"] for m in mb)
    assert read_st(tmp_path / "a.st") == read_st(tmp_path / "b.st")


def test_dynamic_scale_2_40_backs_off_then_trains(tmp_path):
    """fp16 limits: starting at 2^40 every step whose scaled gradient norm
    exceeds 65504 is skipped and halves the scale (checked row by row against
    that rule); the first step under the limit trains. Skipped steps leave the parameters untouched (the run from
    W0 that only skips saves W0 again, bit for bit)."""
    plan = scaled_plan(tmp_path / "d.mplan", "loss_scale=dynamic",
                       f"loss_scale_init={2.0 ** 40}", "loss_scale_backoff=0.5",
                       f"loss_scale_limit={FP16_MAX}", "loss_scale_growth_interval=1000")
    w0 = tmp_path / "w0.st"
    train(scaled_plan(tmp_path / "p.mplan"), 1, tmp_path / "w0.jsonl", ["--save", w0])
    m = tmp_path / "m.jsonl"
    r = train(plan, 40, m, ["--weights", w0, "--save", tmp_path / "w.st"])
    rows = metrics(m)
    scale = 2.0 ** 40
    first = None
    for i, row in enumerate(rows):
        assert row["loss_scale"] == scale, (i, row)
        over = row["grad_norm"] * scale > FP16_MAX
        assert row["skipped"] == over, (i, row)
        if over:  # also later, when the gradients grow: backs off again
            scale *= 0.5
        elif first is None:
            first = i
    assert first is not None and first >= 10, first  # 2^40 · |g| ≫ 65504
    assert sum(not r["skipped"] for r in rows) >= 10  # then it trains
    # The skipped prefix alone: parameters unchanged.
    w = tmp_path / "w_skip.st"
    train(plan, first, tmp_path / "m2.jsonl", ["--weights", w0, "--save", w])
    assert read_st(w) == read_st(w0)
    assert "gradient overflow" not in r.stderr  # --quiet


def test_dynamic_scale_grows_and_resumes_exactly(tmp_path):
    """Growth after the interval, and the scale's state survives a resume."""
    plan = scaled_plan(tmp_path / "d.mplan", "loss_scale=dynamic", "loss_scale_init=4",
                       "loss_scale_growth_interval=3")
    a, ck = tmp_path / "a.jsonl", tmp_path / "ck"
    train(plan, 10, a)
    assert [m["loss_scale"] for m in metrics(a)] == [4, 4, 4, 8, 8, 8, 16, 16, 16, 32]
    train(plan, 5, tmp_path / "b1.jsonl", ["--save-dir", ck])
    train(plan, 10, tmp_path / "b2.jsonl", ["--resume", ck])
    assert metrics(tmp_path / "b2.jsonl")[0]["loss_scale"] == 8
    strip = lambda ms: [(m["loss"], m["grad_norm"], m["loss_scale"]) for m in ms]
    assert strip(metrics(a)) == strip(metrics(tmp_path / "b1.jsonl") + metrics(tmp_path / "b2.jsonl"))


@pytest.mark.parametrize("flags,message", [
    (["--save-every", 2], "--save-every and --save-interval-s need --save-dir"),
    (["--save-dir", "ck", "--save-every", 0], "--save-every needs an integer >= 1"),
    (["--save-dir", "ck", "--save-keep", -1], "--save-keep needs an integer"),
    (["--resume", "ck", "--weights", "w.st"], "--resume and --weights"),
    (["--inject-nan", "gelu"], "--inject-nan needs STEP:OP"),
])
def test_bad_checkpoint_flags(tmp_path, flags, message):
    plan = make_plan(tmp_path / "p.mplan")
    r = run([MAPP_RUN, plan, "--data", CORPUS, "--tokenizer", "bytes", *flags],
            check=False)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_nan_check_every_step_names_the_op(tmp_path):
    """--nan-check: the per-op check runs in the step itself (no re-run)."""
    plan = make_plan(tmp_path / "p.mplan")
    r = train(plan, 6, tmp_path / "m.jsonl", ["--nan-check", "--inject-nan", "3:gelu"],
              check=False)
    assert r.returncode != 0
    assert "non-finite value: step 3" in r.stderr and "op 'gelu'" in r.stderr, r.stderr
    assert "re-ran" not in r.stderr
    assert len(metrics(tmp_path / "m.jsonl")) == 2


# ---- issue 43: the save directory owns only what it wrote; sealed manifests

def step_folders(sd):
    return sorted(d.name for d in sd.iterdir() if d.is_dir() and len(d.name) == 13
                  and d.name.startswith("step-"))


def manifest_of(folder):
    return json.loads((folder / "manifest.json").read_text())


def owner_file(folder, run, plan_hash, pid, pid_start=""):
    folder.mkdir(parents=True)
    (folder / "mapp-owner.json").write_text(json.dumps(
        {"run": run, "plan": plan_hash, "host": socket.gethostname(), "pid": pid,
         "pid_start": pid_start}))
    (folder / "rank-00000.safetensors").write_bytes(b"partial")


def test_save_dir_keeps_what_it_does_not_own(tmp_path):
    """Issue 43 (1): a save removes only its own temporaries and those a dead
    job of the same plan left; a user's `my-results.tmp/` and temporaries of
    a live job or another plan stay."""
    plan = make_plan(tmp_path / "p.mplan")
    train(plan, 1, tmp_path / "m0.jsonl", ["--save-dir", tmp_path / "sd0"])
    m0 = manifest_of(tmp_path / "sd0" / "step-00000001")
    plan_hash = m0.get("run", {}).get("plan", "0x00000000")
    sd = tmp_path / "sd"
    (sd / "my-results.tmp").mkdir(parents=True)
    (sd / "my-results.tmp" / "data.txt").write_text("x")
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = os.getpid()
    me_start = pathlib.Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[19]
    kept = {
        "no owner file": sd / "step-00000001.0123456789abcdef.tmp",
        "live job": sd / "step-00000001.1111111111111111.tmp",
        "another plan": sd / "step-00000001.2222222222222222.tmp",
    }
    kept["no owner file"].mkdir()
    owner_file(kept["live job"], "1111111111111111", plan_hash, me, me_start)
    owner_file(kept["another plan"], "2222222222222222", "0xdeadbeef", dead.pid)
    abandoned = sd / "step-00000001.3333333333333333.tmp"
    owner_file(abandoned, "3333333333333333", plan_hash, dead.pid)
    train(plan, 2, tmp_path / "m.jsonl", ["--save-dir", sd])
    assert (sd / "my-results.tmp" / "data.txt").exists()
    assert (sd / "my-results.tmp" / "data.txt").read_text() == "x"
    for why, d in kept.items():
        assert d.exists(), why
    assert not abandoned.exists()
    assert step_folders(sd) == ["step-00000002"]


def test_other_runs_newer_checkpoints_refused_then_overwritten(tmp_path):
    """Issue 43 (2): a save dir with another run's step-3/4/5 and a new run
    of 2 steps: refused at start naming them (it used to write step-2 and
    prune it as the oldest, exit 0); --save-dir-overwrite replaces them."""
    plan = make_plan(tmp_path / "p.mplan")
    sd = tmp_path / "sd"
    train(plan, 5, tmp_path / "a.jsonl", ["--save-dir", sd, "--save-every", 1])
    assert step_folders(sd) == ["step-00000003", "step-00000004", "step-00000005"]
    r = train(plan, 2, tmp_path / "b.jsonl", ["--save-dir", sd], check=False)
    assert r.returncode != 0
    for n in (3, 4, 5):
        assert f"step-0000000{n} (run " in r.stderr, r.stderr
    assert "--save-dir-overwrite" in r.stderr
    assert step_folders(sd) == ["step-00000003", "step-00000004", "step-00000005"]
    r = train(plan, 2, tmp_path / "c.jsonl", ["--save-dir", sd, "--save-dir-overwrite"])
    assert step_folders(sd) == ["step-00000002"]
    got = tmp_path / "d.jsonl"
    train(plan, 3, got, ["--resume", sd])
    assert [m["step"] for m in metrics(got)] == [2]


def test_retention_follows_the_lineage(tmp_path):
    """Issue 43 (2): "keep the newest 3" prunes this run's lineage (its own
    checkpoints and those of the run it resumed), never another run's."""
    plan = make_plan(tmp_path / "p.mplan")
    sd, other = tmp_path / "sd", tmp_path / "other"
    train(plan, 1, tmp_path / "x.jsonl", ["--save-dir", other])
    train(plan, 4, tmp_path / "a.jsonl", ["--save-dir", sd, "--save-every", 1])
    assert step_folders(sd) == ["step-00000002", "step-00000003", "step-00000004"]
    shutil.copytree(other / "step-00000001", sd / "step-00000001")
    run_a = manifest_of(sd / "step-00000004").get("run", {}).get("id")
    train(plan, 7, tmp_path / "b.jsonl",
          ["--resume", sd, "--save-dir", sd, "--save-every", 1])
    assert step_folders(sd) == ["step-00000001", "step-00000005", "step-00000006",
                                "step-00000007"]
    m = manifest_of(sd / "step-00000007")
    assert m["run"]["lineage"] == [{"run": run_a, "step": 4}]
    assert m["run"]["id"] != run_a


def test_manifestless_step_folder_reported_on_resume(tmp_path):
    """Issue 43 (2): a step-N without manifest.json (a kill while an older
    mapp pruned) is named on resume, not skipped silently."""
    plan = make_plan(tmp_path / "p.mplan")
    sd = tmp_path / "sd"
    train(plan, 2, tmp_path / "a.jsonl", ["--save-dir", sd])
    shutil.copytree(sd / "step-00000002", sd / "step-00000009")
    (sd / "step-00000009" / "manifest.json").unlink()
    got = tmp_path / "b.jsonl"
    r = train(plan, 3, got, ["--resume", sd])
    assert "step-00000009' has no manifest.json" in r.stderr, r.stderr
    assert [m["step"] for m in metrics(got)] == [2]


@pytest.fixture(scope="module")
def sealed_checkpoint(tmp_path_factory):
    """A tp=2 checkpoint at step 2 (two shards) to edit."""
    d = tmp_path_factory.mktemp("sealed")
    plan, ck = make_checkpoint(d)
    return plan, ck


def reseal(m):
    """The seal as docs/checkpoints.md defines it: CRC-32 of the compact,
    key-sorted JSON of every field but "seal"."""
    body = {k: v for k, v in m.items() if k != "seal"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    m["seal"] = {"crc32": "%08x" % zlib.crc32(text.encode())}


def swap_ranks(m):
    a, b = m["shards"][0], m["shards"][1]
    a["rank"], b["rank"] = b["rank"], a["rank"]


def set_step(n, consistent=False):
    def edit(m):
        m["step"] = n
        if consistent:  # the fields that follow the step, edited alike
            m["rng"]["step"] = n
            m["data"]["samples_consumed"] = n * m["data"]["samples_per_step"]
    return edit


def set_field(section, key, value):
    def edit(m):
        m[section][key] = value
    return edit


# (edit, resealed, what the error must say): unresealed edits are refused by
# the seal (naming the field the shards contradict); resealed ones by the
# field checks or by the shards' own metadata.
MANIFEST_EDITS = {
    "swap-rank": (swap_ranks, False, ["seal does not match", "'shards[0].rank' says 1"]),
    "step-3": (set_step(3), False, ["seal does not match", "'step' says 3"]),
    "step-99999999": (set_step(99999999), False, ["seal does not match", "'step' says 99999999"]),
    "no-seal": (lambda m: m.pop("seal", None), False, ["not sealed"]),
    "resealed-swap-rank": (swap_ranks, True, ["field 'shards[0].rank' is 1"]),
    "resealed-step-3": (set_step(3, True), True, ["field 'step' says 3", "own metadata says step 2"]),
    "resealed-step-99999999": (set_step(99999999, True), True, ["step 99999999", "--steps 4"]),
    "resealed-tp-0": (set_field("layout", "tp", 0), True, ["field 'layout.tp' is 0"]),
    "resealed-dp-neg": (set_field("layout", "dp", -1), True, ["field 'layout.dp' is -1"]),
    "resealed-vocab": (set_field("model", "vocab_size", 300), True, ["'model.vocab_size'", "300"]),
    "resealed-optimizer": (set_field("model", "optimizer", "sgd"), True, ["'model.optimizer'", "'sgd'"]),
    "resealed-unknown-field": (set_field("data", "extra", 1), True, ["field 'data.extra' is not a field"]),
}


@pytest.mark.parametrize("case", MANIFEST_EDITS)
def test_manifest_edit_refused_naming_the_field(tmp_path, sealed_checkpoint, case):
    """Issue 43 (3): the manifest is sealed and every field checked; an edit
    used to resume silently into wrong state (swapped ranks, step 3 with
    step-2 weights) or exit 0 having done nothing (step 99999999)."""
    plan, src = sealed_checkpoint
    ck = tmp_path / "ck"
    shutil.copytree(src, ck)
    edit, resealed, says = MANIFEST_EDITS[case]
    m = manifest_of(ck)
    edit(m)
    if resealed:
        reseal(m)
    (ck / "manifest.json").write_text(json.dumps(m, indent=1))
    err = resume_error(plan, ck, tmp_path)
    for s in says:
        assert s in err, err


def test_checkpoint_past_steps_refused(tmp_path, sealed_checkpoint):
    """Issue 43 (3): a checkpoint past --steps has nothing to run (it used to
    exit 0 having done nothing)."""
    plan, ck = sealed_checkpoint
    r = train(plan, 1, tmp_path / "r.jsonl", ["--resume", ck], check=False)
    assert r.returncode != 0 and "past this run's --steps 1" in r.stderr, r.stderr

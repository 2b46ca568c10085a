"""A hung MPI rank is named by the ranks that wait for it (issue 43, defect 8).

A SIGSTOPped process cannot answer, and a pending MPI request cannot say
which member is missing; the MPI communicator asks the ranks a timed-out
wait waits for, on a side communicator, and names those that do not answer
within the grace period min(2 s, timeout / 4) (runtime/README.md, "mpi").

- Collective: 4 ranks (dp=4) train under `--comm-timeout 3`; once rank 0
  has printed step 2, rank 2's process (found by OMPI_COMM_WORLD_RANK in
  the environment of mpirun's children) gets SIGSTOP at whatever point it
  is. Every survivor times out in a collective over the world and must
  say `timed out after 3 s waiting for rank(s) 2 (rank 2 did not answer
  within 0.75 s: stopped, hung or dead)`; before the fix they said only
  `timed out after 3 s (a peer is dead or the ranks' plans disagree)`.
- Point-to-point: pp=2 x dp=2, `--inject stop:rank=3,from-step=2` (rank 3
  stops itself at the start of step 2, so rank 1, its pipeline peer, is
  waiting for its gradient). Rank 1's recv must name rank 3 as not
  answering; every other survivor's message names rank 3 as the only rank
  that did not answer, or rank 1 with where it waits (for rank 3).

Both: the job exits non-zero within timeout + 2 grace periods (the wait,
the grace, and the failed rank's grace for late askers) + slack, and every
rank process is continued and killed in a finally block.

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, else $MAPP_BIN or build/bin.
"""
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]


MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
MPIRUN = shutil.which("mpirun")
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"
TIMEOUT = 3
GRACE = min(2.0, TIMEOUT / 4)
# The wait, its grace period, the failed rank's grace period for late
# askers; the rest is mpirun tearing the job down on 2 busy cores.
END_WITHIN = TIMEOUT + 2 * GRACE + 8

pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                                reason="mapp-run / mapp-make-test-plan not built")


@pytest.fixture
def mpi():
    if MPIRUN is None:
        pytest.skip("no mpirun")
    r = subprocess.run([MAPP_RUN, "--help"], capture_output=True, text=True)
    if "built with communicators: local, mpi" not in r.stdout:
        pytest.skip("mapp-run built without MPI")


def rank_pids(mpirun_pid):
    """{rank: pid} of mpirun's direct children that are MPI ranks."""
    out = {}
    kids = subprocess.run(["pgrep", "-P", str(mpirun_pid)], capture_output=True,
                          text=True).stdout.split()
    for k in kids:
        try:
            env = pathlib.Path(f"/proc/{k}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(e.split(b"=")[1])] = int(k)
    return out


def stat_fields(pid):
    """/proc/PID/stat after the command name, or None when gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def state(pid):
    """The process state letter (R, S, T, Z, ...) or None when gone."""
    f = stat_fields(pid)
    return f[0] if f else None


def start_time(pid):
    """When the process started (clock ticks since boot): with the pid, it
    tells our rank from a later process that got the same pid."""
    f = stat_fields(pid)
    return f[19] if f else None


class Job:
    """mpirun -np N mapp-run ...; stdout/stderr collected by threads."""

    def __init__(self, n, args):
        self.p = subprocess.Popen(
            [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", str(n),
             MAPP_RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.n = n
        self.out, self.err = [], []
        self.readers = [
            threading.Thread(target=self._read, args=(s, d), daemon=True)
            for s, d in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.readers:
            t.start()
        self.pids, self.starts = {}, {}

    @staticmethod
    def _read(stream, chunks):
        # Chunks, not lines: under mpirun a rank's stdout is a terminal, so
        # rank 0 redraws its progress bar with "\r" and no newline.
        while True:
            b = os.read(stream.fileno(), 65536)
            if not b:
                return
            chunks.append(b.decode(errors="replace"))

    def wait_for(self, cond, what, limit=90):
        deadline = time.time() + limit
        while time.time() < deadline:
            if len(self.pids) < self.n:
                self.pids = rank_pids(self.p.pid)
                self.starts = {p: start_time(p) for p in self.pids.values()}
            if cond():
                return
            assert self.p.poll() is None, (
                f"job ended before {what}:\n" + "".join(self.err)[-3000:])
            time.sleep(0.05)
        pytest.fail(f"no {what} within {limit} s:\n" + "".join(self.err)[-3000:])

    def finish(self, limit):
        try:
            self.p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job still running {limit} s after the stop")
        for t in self.readers:
            t.join(timeout=10)
        return "".join(self.err)

    def cleanup(self):
        # Nothing left behind: continue the stopped rank and end them all
        # (those still running: the same pid and start time).
        for pid in self.pids.values():
            if start_time(pid) is None or start_time(pid) != self.starts[pid]:
                continue
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def plan(tmp_path, *layout):
    path = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, str(path), "vocab=256", "hidden=32", "ffn=64",
                    "batch=2", "seq=16", "microbatches=2", *layout],
                   check=True, capture_output=True)
    return str(path)


def run_args(plan_path, *extra):
    return [plan_path, "--comm=mpi", "--data", str(CORPUS), "--tokenizer",
            "bytes", "--steps", "1000000", "--threads", "1",
            "--comm-timeout", str(TIMEOUT), *extra]


def survivor_errors(err, victim):
    """{rank: message} of the `mapp-run: rank R: ...` lines but the
    victim's (mpirun's abort continues it before the kill, and it may
    report its own wait as timed out)."""
    return {int(m.group(1)): m.group(2)
            for m in re.finditer(r"^mapp-run: rank (\d+): (.*)$", err, re.M)
            if int(m.group(1)) != victim}


def silent_ranks(msg):
    """The ranks a message says did not answer."""
    m = re.search(r"ranks? ([\d,]+) did not answer within", msg)
    return {int(r) for r in m.group(1).split(",")} if m else set()


def check_names_only(victim, errors):
    """Each message is a timeout naming `victim` as the only silent rank;
    any other rank it waits for is described as alive (where it is)."""
    for r, msg in errors.items():
        assert f"timed out after {TIMEOUT} s waiting for rank(s) " in msg, (r, msg)
        assert silent_ranks(msg) <= {victim}, (r, msg)
        waited = re.search(r"waiting for rank\(s\) ([\d,]+) \(", msg).group(1)
        for w in map(int, waited.split(",")):
            if w != victim:
                assert re.search(rf"rank {w} (is \d+ collectives? of this "
                                 rf"group behind and )?(is waiting in|"
                                 rf"has failed|is computing)", msg), (r, msg)
        assert f"rank {victim}" in msg, (r, msg)


def test_mpi_collective_timeout_names_the_stopped_rank(tmp_path, mpi):
    victim = 2
    job = Job(4, run_args(plan(tmp_path, "dp=4")))
    try:
        # Training is under way (every group in use) before the stop.
        job.wait_for(lambda: "step 2/" in "".join(job.out)
                     and len(job.pids) == 4, "step 2 on 4 ranks")
        os.kill(job.pids[victim], signal.SIGSTOP)
        t0 = time.time()
        err = job.finish(60)
        took = time.time() - t0
    finally:
        job.cleanup()
    assert job.p.returncode != 0
    assert took < END_WITHIN, f"job took {took:.1f} s to end after the stop"
    errors = survivor_errors(err, victim)
    # Every survivor reports (they time out together; a failed rank answers
    # for one more grace period before the job is aborted).
    assert set(errors) == {0, 1, 3}, err[-3000:]
    check_names_only(victim, errors)
    for r, msg in errors.items():
        # A collective over all four (the executor may prefix the op); the
        # rank it waits for is the victim alone: a survivor still in an
        # earlier collective that the others completed is named after it.
        assert re.search(rf"\w+ over \w+ \[0,1,2,3\] \(rank {r}\): timed out "
                         rf"after {TIMEOUT} s waiting for rank\(s\) {victim} "
                         rf"\(rank {victim} did not answer within {GRACE:g} s: "
                         r"stopped, hung or dead\)", msg), (r, msg)


def test_mpi_p2p_timeout_names_the_stopped_peer(tmp_path, mpi):
    victim, peer = 3, 1  # pp=2 x dp=2: rank 1 (stage 0) feeds rank 3
    job = Job(4, run_args(plan(tmp_path, "pp=2", "dp=2"), "--quiet",
                          "--inject", f"stop:rank={victim},from-step=2"))
    try:
        job.wait_for(lambda: victim in job.pids
                     and state(job.pids[victim]) == "T",
                     f"rank {victim} stopped")
        t0 = time.time()
        err = job.finish(60)
        took = time.time() - t0
    finally:
        job.cleanup()
    assert job.p.returncode != 0
    assert took < END_WITHIN, f"job took {took:.1f} s to end after the stop"
    errors = survivor_errors(err, victim)
    assert peer in errors, err[-3000:]
    # The pipeline peer's receive names the sender that never answered.
    assert re.search(
        rf"recv on rank {peer} from rank {victim} \(tag \d+\)"
        rf"( and \d+ other receive\(s\))? \(rank {peer}\): timed out after "
        rf"{TIMEOUT} s waiting for rank\(s\) {victim} \(rank {victim} did not "
        rf"answer within {GRACE:g} s: stopped, hung or dead\)",
        errors[peer]), errors[peer]
    check_names_only(victim, errors)


def test_stop_injection_needs_mpi(tmp_path):
    """Rank-threads share one process: stopping one would stop them all."""
    r = subprocess.run([MAPP_RUN, plan(tmp_path, "dp=2"), "--data",
                        str(CORPUS), "--tokenizer", "bytes", "--steps", "1",
                        "--inject", "stop:rank=1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "--inject stop: needs --comm=mpi" in r.stderr, r.stderr

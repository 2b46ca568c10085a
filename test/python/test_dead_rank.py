"""A rank killed mid-run ends the whole job, with a message, without a hang.

MPI: 4 ranks (pp2 x dp2) under mpirun train for many steps; one rank's
process is found (the child of mpirun whose OMPI_COMM_WORLD_RANK is 2) and
killed with SIGKILL. The job must end within 60 s of the kill with exit
status != 0 and a message naming rank 2 (mpirun's "process rank 2 ... exited
on signal 9", or a surviving rank's comm error naming it); the subprocess is
given 90 s before the test calls it a hang.

Local (thread world): a rank cannot be killed alone; the injectable
failure is a rank that stops answering, which the --comm-timeout path
reports (`timed out ... waiting for rank(s) R`). The runtime offers no
--inject for that, so that part is skipped.

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, else $MAPP_BIN or build/bin.
"""
import os
import pathlib
import re
import shutil
import subprocess
import time

import pytest

from conftest import find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]


MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
MPIRUN = shutil.which("mpirun")
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"
pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                                reason="mapp-run / mapp-make-test-plan not built")
VICTIM = 2


def mpi_has_comm():
    r = subprocess.run([MAPP_RUN, "--help"], capture_output=True, text=True)
    return "built with communicators: local, mpi" in r.stdout


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


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun")
def test_mpi_killed_rank_ends_job(tmp_path):
    if not mpi_has_comm():
        pytest.skip("mapp-run built without MPI")
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, str(plan), "vocab=256", "hidden=32", "ffn=64",
                    "batch=2", "seq=16", "microbatches=2", "pp=2", "dp=2"],
                   check=True, capture_output=True)
    p = subprocess.Popen(
        [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4", MAPP_RUN,
         str(plan), "--comm=mpi", "--data", str(CORPUS), "--tokenizer", "bytes",
         "--steps", "1000000", "--threads", "1", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until all 4 ranks run and have printed their coordinates.
        deadline = time.time() + 60
        pids = {}
        while time.time() < deadline and len(pids) < 4 and p.poll() is None:
            time.sleep(0.5)
            pids = rank_pids(p.pid)
        assert p.poll() is None, p.communicate()
        assert VICTIM in pids, pids
        time.sleep(2)  # mid-run: training steps are under way
        assert p.poll() is None, "job ended before the kill"
        os.kill(pids[VICTIM], 9)
        t0 = time.time()
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("job hangs 90 s after rank 2 was killed")
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    assert took < 60, f"job took {took:.1f} s to end"
    text = out + err
    assert re.search(rf"rank {VICTIM}\b", text), text[-3000:]
    # No survivor is left behind.
    time.sleep(0.5)
    for r, pid in pids.items():
        assert not pathlib.Path(f"/proc/{pid}").exists() or \
            "zombie" in pathlib.Path(f"/proc/{pid}/status").read_text().lower() or \
            " Z " in pathlib.Path(f"/proc/{pid}/stat").read_text(), (r, pid)


def test_local_dead_rank():
    pytest.skip("mapp-run has no injectable rank failure for --comm=local "
                "(the thread world reports a failing rank as 'rank R failed')")

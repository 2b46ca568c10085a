"""Run identity in trace headers (issue 17): every rank of one job writes the
same run_id and the plan's seal checksum; two jobs differ; mapp-scan refuses
to merge their files. Checked for ranks as threads (--comm=local) and as MPI
processes (rank 0's id broadcast)."""
import json
import os
import pathlib
import shutil
import struct
import subprocess

import pytest

from conftest import find_tool
from test_multirank import CORPUS, MAPP_RUN, MPIRUN, make_plan

MAPP_SCAN = find_tool("mapp-scan")
pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAPP_SCAN is None,
                                reason="mapp-run / mapp-scan not built")


def seal_checksum(plan):
    # plan.fbs PlanSeal: magic, version, body_bytes, checksum, reserved.
    magic, _, _, checksum, _ = struct.unpack("<IIQII", plan.read_bytes()[-24:])
    assert magic == 0x4C53504D
    return f"0x{checksum:08x}"


def traced(plan, out, comm):
    args = [plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", 1,
            "--quiet", "--trace-dir", out]
    if comm == "mpi":
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", 2,
               MAPP_RUN, *args, "--comm=mpi", "--threads", 1]
    else:
        cmd = [MAPP_RUN, *args, "--threads", 1]
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                   timeout=300)
    return [json.loads((out / f"rank-{r}.trace.jsonl").read_text()
                       .splitlines()[0]) for r in range(2)]


@pytest.mark.parametrize("comm", ["local", pytest.param("mpi", marks=
    pytest.mark.skipif(MPIRUN is None, reason="no mpirun"))])
def test_ranks_share_a_run_id_and_the_plan_hash(tmp_path, comm):
    plan = tmp_path / "p.mplan"
    make_plan(plan, tp=2, extra=["trace=1"])
    first = traced(plan, tmp_path / "a", comm)
    second = traced(plan, tmp_path / "b", comm)
    for hdrs in (first, second):
        assert hdrs[0]["run_id"] == hdrs[1]["run_id"]
        assert len(hdrs[0]["run_id"]) == 16
        assert all(h["plan"] == seal_checksum(plan) for h in hdrs)
        assert (hdrs[0]["tp_size"], hdrs[0]["world"]) == (2, 2)
    assert first[0]["run_id"] != second[0]["run_id"]

    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "a", mixed)
    shutil.copy(tmp_path / "b" / "rank-1.trace.jsonl", mixed)
    r = subprocess.run([MAPP_SCAN, str(mixed)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "traces of different runs cannot be merged" in r.stderr
    assert "rank-0.trace.jsonl; run_id" in r.stderr or \
        "rank-1.trace.jsonl; run_id" in r.stderr, r.stderr
    # Each run alone is one consistent run.
    for d in ("a", "b"):
        ok = subprocess.run([MAPP_SCAN, str(tmp_path / d), "-q"],
                            capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr

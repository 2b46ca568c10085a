"""A host with more ranks than CPUs: slowness in CPU time is said, not judged.

Rank threads (or processes) that outnumber their host's CPUs share caches
and cores; their CPU time per op grows with what the neighbours evict, by
20% between two healthy rank threads of CI's 2-core VM (a false slow rank
in test_scan_comm_parity). mapp-run records each process's CPU affinity in
the trace header (`cpus`); mapp-scan unites it per host and, where ranks
outnumber the CPUs, holds a slow rank to the busy host's bar (1.5x,
docs/mapp-scan.md). Known answer: mapp-sim's traces with rank 5 1.3x slow,
given CPU times (each compute event's span) and a `cpus` list per header.
"""
import json
import pathlib
import subprocess

import pytest

from conftest import find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]
MAPP_SIM = find_tool("mapp-sim")
MAPP_SCAN = find_tool("mapp-scan")
MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
SIM_CONFIG = REPO / "test" / "Tools" / "mapp-sim" / "Inputs" / "tp2pp2dp2.json"
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"


def scan(traces, tmp_path):
    report = tmp_path / "r.json"
    # --no-align: the simulated nodes' clocks, now one host's, are the
    # headers' (alignment would take one host for one clock).
    r = subprocess.run([MAPP_SCAN, traces, "-q", "--no-align", "--report",
                        report],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(report.read_text())


def with_cpus(src, dst, cpus):
    """src's rank files with CPU times on the non-comm events (their spans,
    as a rank alone on its core would read), one process for all (CPU
    times across processes meet a bar of their own) and `cpus` in each
    header (None: left out, as in traces before the field)."""
    dst.mkdir()
    for f in src.glob("*.jsonl"):
        out = []
        for line in f.read_text().splitlines():
            j = json.loads(line)
            if j.get("type") == "header":
                j["host"], j["pid"] = "node", 4242  # one process of threads
                if cpus is not None:
                    j["cpus"] = cpus
            elif "type" not in j and j.get("cat") != "comm":
                j["cpu"] = j["e"] - j["b"]
            out.append(json.dumps(j))
        (dst / f.name).write_text("\n".join(out) + "\n")
    return dst


@pytest.mark.skipif(MAPP_SIM is None or MAPP_SCAN is None,
                    reason="mapp-sim / mapp-scan not built")
def test_slow_rank_on_an_oversubscribed_host_is_not_judged(tmp_path):
    sim = tmp_path / "sim"
    subprocess.run([MAPP_SIM, "--config", SIM_CONFIG, "-o", sim, "-q",
                    "--inject", "slow-compute:rank=5,factor=1.3"], check=True)
    # CPUs enough for the 8 rank threads, and no list at all: named.
    for name, cpus in (("roomy", "0-7"), ("unknown", None)):
        r = scan(with_cpus(sim, tmp_path / name, cpus), tmp_path)
        assert [(f["kind"], f.get("rank")) for f in r["findings"]] == \
            [("slow-rank", 5)], (name, r["findings"], r["warnings"])
    # Seven CPUs for eight rank threads: said in a warning under the busy
    # host's bar, not judged.
    r = scan(with_cpus(sim, tmp_path / "tight", "0-3,5,7-8"), tmp_path)
    assert r["findings"] == [], r["findings"]
    assert any("rank 5's compute was" in w and "more threads than cores" in w
               for w in r["warnings"]), r["warnings"]


@pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                    reason="mapp-run not built")
def test_mapp_run_records_its_cpus(tmp_path):
    """The header's `cpus` is this process's affinity: with taskset, the
    CPUs it names."""
    plan = tmp_path / "p.mplan"
    subprocess.run([MAKE_PLAN, plan, "vocab=256", "hidden=16", "ffn=24",
                    "batch=2", "seq=8", "pp=2", "trace=1"], check=True)
    subprocess.run(["taskset", "-c", "0", MAPP_RUN, plan, "--data", CORPUS,
                    "--tokenizer", "bytes", "--steps", "1", "--quiet",
                    "--trace-dir", tmp_path / "tr"], check=True)
    for f in (tmp_path / "tr").glob("*.jsonl"):
        assert json.loads(f.read_text().splitlines()[0])["cpus"] == "0"

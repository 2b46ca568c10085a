"""The merged Chrome trace of `mapp-scan -o` obeys the Trace Event Format.

Checked on a real 8-rank run (tp2 x pp2 x dp2, --comm=local, traced) and on
a mapp-sim trace of the same layout:
- every event has ph, ts, pid, tid, name (M metadata: ph, pid, name, args);
- X events have dur >= 0, and per (pid, tid) track durations nest (two
  events either are disjoint or one contains the other, no partial overlap);
- every flow start `s` has a finish `f` with the same (cat, id) and vice
  versa (steps `t` only between them);
- every pid has process_name metadata "DP{d}-PP{p}-TP{t}" (the mapp-scan
  form adds " (rank r)"), consistent with the rank = pid and the layout;
- counter events C have a non-empty numeric args object.

Tools: $MAPP_RUN, $MAPP_MAKE_TEST_PLAN, $MAPP_SCAN, $MAPP_SIM, else $MAPP_BIN
or build/bin.
"""
import collections
import json
import pathlib
import re
import subprocess

import pytest

from conftest import find_tool

REPO = pathlib.Path(__file__).resolve().parents[2]


MAPP_RUN = find_tool("mapp-run")
MAKE_PLAN = find_tool("mapp-make-test-plan")
MAPP_SCAN = find_tool("mapp-scan")
MAPP_SIM = find_tool("mapp-sim")
CORPUS = REPO / "data" / "gpt" / "news-1k.jsonl"
SIM_CONFIG = REPO / "test" / "Tools" / "mapp-sim" / "Inputs" / "tp2pp2dp2.json"
pytestmark = pytest.mark.skipif(MAPP_SCAN is None, reason="mapp-scan not built")


def sh(args, timeout=300):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{args[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def check_chrome(path, world, dims):
    doc = json.loads(pathlib.Path(path).read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert events, "empty trace"
    tracks = collections.defaultdict(list)
    flows = collections.defaultdict(lambda: collections.Counter())
    names = {}
    counters = 0
    for e in events:
        ph = e.get("ph")
        assert ph, e
        assert "pid" in e and "name" in e, e
        if ph == "M":
            assert isinstance(e.get("args"), dict), e
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        for k in ("ts", "tid"):
            assert k in e, (k, e)
        assert isinstance(e["ts"], (int, float)), e
        if ph == "X":
            assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph in ("s", "t", "f"):
            assert "id" in e and "cat" in e, e
            flows[(e["cat"], e["id"])][ph] += 1
        elif ph == "C":
            counters += 1
            args = e.get("args")
            assert isinstance(args, dict) and args, e
            assert all(isinstance(v, (int, float)) for v in args.values()), e
        else:
            assert ph in ("B", "E", "i", "I"), f"unexpected phase {ph}: {e}"
    # Nesting per track: sort by (begin, -end); a stack of open intervals.
    # The tolerance absorbs the rounding of ts and dur to 3 decimals (ns):
    # an end computed as ts + dur can be off by two half-ns roundings.
    eps = 2e-3 + 1e-9
    nx = 0
    for key, iv in tracks.items():
        iv.sort(key=lambda x: (x[0], -x[1]))
        stack = []
        for b, e, n in iv:
            nx += 1
            while stack and stack[-1][1] <= b + eps:
                stack.pop()
            if stack:
                assert e <= stack[-1][1] + eps, \
                    f"partial overlap on track {key}: {stack[-1]} and {(b, e, n)}"
            stack.append((b, e, n))
    assert nx > 0
    # Flows: each (cat, id) has exactly one s and one f.
    assert flows, "no flow events"
    for key, c in flows.items():
        assert c["s"] == 1 and c["f"] == 1, (key, dict(c))
    # Process names: one per rank, DP{d}-PP{p}-TP{t}, matching the layout.
    tp, pp, dp = dims
    assert sorted(names) == list(range(world)), names
    for pid, n in names.items():
        m = re.fullmatch(r"DP(\d+)-PP(\d+)-TP(\d+)(?: \(rank (\d+)\))?", n)
        assert m, n
        d, p, t = map(int, m.groups()[:3])
        assert t + tp * (d + dp * p) == pid, (pid, n)
        if m.group(4) is not None:
            assert int(m.group(4)) == pid
    used = {e["pid"] for e in events if e.get("ph") != "M"}
    assert used <= set(names), used - set(names)
    return {"x": nx, "flows": len(flows), "counters": counters}


@pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None, reason="mapp-run not built")
def test_merged_trace_of_real_run(tmp_path):
    plan = tmp_path / "p.mplan"
    sh([MAKE_PLAN, plan, "vocab=256", "hidden=32", "ffn=64", "batch=2", "seq=16",
        "microbatches=4", "tp=2", "pp=2", "dp=2", "trace=1"])
    sh([MAPP_RUN, plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", 3,
        "--quiet", "--threads", 1, "--trace-dir", tmp_path / "tr",
        "--inject", "link-delay:src=1,dst=5,us=2000"])
    sh([MAPP_SCAN, tmp_path / "tr", "-q", "-o", tmp_path / "merged.json"])
    got = check_chrome(tmp_path / "merged.json", 8, (2, 2, 2))
    assert got["counters"] > 0


@pytest.mark.skipif(MAPP_SIM is None or not SIM_CONFIG.exists(), reason="mapp-sim not built")
def test_merged_trace_of_mapp_sim(tmp_path):
    sh([MAPP_SIM, "--config", SIM_CONFIG, "-o", tmp_path / "tr", "-q",
        "--inject", "slow-compute:rank=5,factor=1.5"])
    sh([MAPP_SCAN, tmp_path / "tr", "-q", "-o", tmp_path / "merged.json"])
    got = check_chrome(tmp_path / "merged.json", 8, (2, 2, 2))
    assert got["counters"] > 0

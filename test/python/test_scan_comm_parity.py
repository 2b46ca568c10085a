"""MegaScan finds the same faults whatever carries the messages.

The same plan and the same injected faults, once as rank threads
(--comm=local, whose sender stamps each payload's landing) and once as
one MPI process per rank (whose receiver only learns of a landing when a
poll finds it, docs/mapp-scan.md "Slow link"): mapp-scan must name
exactly the injected culprits in both. 2 ranks: a GPT of 8 layers over
pp=2 (the case where MPI runs lost the link delay: no finding, or the
victim and the wrong direction named); 4 ranks pp2·dp2 and 8 ranks
tp2·pp2·dp2: the hand-built MLP. Kinds: no fault, a slow rank, a slow
link, both at once, and two slow links of opposite directions (two ranks
have no third link to tell two slow ones from: not run there).
CTest runs this file alone (RUN_SERIAL): the MPI worlds oversubscribe
CI's 2 cores by themselves.
"""
import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "scenarios", REPO / "bench" / "scan" / "scenarios.py")
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

pytestmark = pytest.mark.skipif(
    not (sc.MAPP_RUN and sc.MAKE_PLAN and sc.MAPP_SCAN and sc.MAPP_OPT
         and sc.MAPP_TRANSLATE),
    reason="mapp tools not built")

CASES = ([("gpt8-pp2", k) for k in ("clean", "slow", "delay", "double")] +
         [(layout, k) for layout in ("pp2dp2", "tp2pp2dp2")
          for k in ("clean", "slow", "delay", "double", "links2")])


@pytest.mark.parametrize("layout,kind", CASES,
                         ids=[f"{l}-{k}" for l, k in CASES])
def test_same_findings_local_and_mpi(tmp_path, layout, kind):
    if not sc.mpi_usable():
        pytest.skip("no mpirun, or mapp-run built without MPI")
    found = {}
    for comm in ("local", "mpi"):
        # On CI's 2 busy cores a 3x CPU burner among 4-8 processes reads as
        # ~2x (docs/benchmarks.md), and among 4 rank threads it once read
        # under the busy host's 1.5x bar (a CI rehearsal, pp2dp2 local);
        # 5x stays clear of both, the same fault for both communicators.
        r = sc.run_scenario((comm, layout, kind), tmp_path, 5)
        # The whole result (per-rank ratios included): pytest would cut it.
        assert not r["fp"] and not r["fn"], f"{comm}: {json.dumps(r)}"
        found[comm] = r["found"]
    assert found["local"] == found["mpi"]

"""MegaScan on real runs, the fast subset of bench/scan/scenarios.py.

Two 8-rank runs (tp2 x pp2 x dp2, --comm=local, 6 traced steps): fault-free
(no finding) and one rank 3x slower (exactly that slow-rank). The full suite
(24 runs, slow links, MPI, double faults) and its precision/recall table:
docs/benchmarks.md.
"""
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "scenarios", REPO / "bench" / "scan" / "scenarios.py")
sc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sc)

pytestmark = pytest.mark.skipif(
    not (sc.MAPP_RUN and sc.MAKE_PLAN and sc.MAPP_SCAN),
    reason="mapp-run / mapp-make-test-plan / mapp-scan not built")


@pytest.mark.parametrize("scenario", sc.QUICK, ids=[sc.name_of(s) for s in sc.QUICK])
def test_scenario(tmp_path, scenario):
    r = sc.run_scenario(scenario, tmp_path)
    assert not r["fn"] and not r["fp"], r

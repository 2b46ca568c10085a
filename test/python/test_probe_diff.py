"""mapp.probe_diff names where two runs part, with a known answer: an offset
injected on one op's output (a perturbation compiled into the second plan)
makes that op the first departing point in execution order, every point the
run recorded before it identical; a run against itself departs nowhere; bad
stores are clear errors."""

import subprocess
import sys

import pytest

from mapp import probe_diff
from scope_ref import export, compile_plan, train

STATS = ["mean", "std", "absmax"]
PROBES = [{"name": "**", "reduce": STATS}, {"name": "grad:**", "reduce": STATS}]
TARGET = "layers.1.mlp.fc1"


def store(tmp, plan, tag, *extra):
    train(tmp, plan, 1, "--probe-db", tmp / f"{tag}.sqlite", *extra, tag=tag)
    return tmp / f"{tag}.sqlite"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe_diff")
    export(tmp)
    plain = compile_plan(tmp, {"probes": PROBES}, name="plain")
    fault = compile_plan(tmp, {"probes": PROBES, "perturbations": [
        {"name": TARGET, "kind": "offset", "magnitude": 1e-2}]}, name="fault")
    fewer = compile_plan(tmp, {"probes": PROBES[:1]}, name="fewer")
    return tmp, {"plain": store(tmp, plain, "plain"), "again": store(tmp, plain, "again"),
                 "fault": store(tmp, fault, "fault"), "fewer": store(tmp, fewer, "fewer")}


def test_the_injected_op_is_the_first_departing_point(runs, capsys):
    _, s = runs
    rows = probe_diff.compare(probe_diff.load(s["fault"], 0), probe_diff.load(s["plain"], 0))
    points = [p for p, _, _ in rows]
    first = next(p for p, rel, _ in rows if rel > 1e-4)
    assert first == TARGET
    # Everything recorded before it is bit-identical; the forward after it
    # and every gradient moved.
    assert all(rel == 0 for _, rel, _ in rows[:points.index(TARGET)])
    assert points.index(TARGET) > 10
    assert dict((p, r) for p, r, _ in rows)["grad:wte.weight"] > 1e-4
    assert probe_diff.main([str(s["fault"]), str(s["plain"])]) == 1
    assert f"first above 0.0001: '{TARGET}'" in capsys.readouterr().out


def test_a_run_against_its_twin_departs_nowhere(runs, capsys):
    _, s = runs
    assert probe_diff.main([str(s["again"]), str(s["plain"]), "--all"]) == 0
    out = capsys.readouterr().out
    assert "worst 0.000e+00" in out and "none above" in out


def test_bad_stores_are_named(runs, tmp_path):
    tmp, s = runs
    not_db = tmp_path / "x.sqlite"
    not_db.write_text("not sqlite")
    two = store(tmp, tmp / "plain.mplan", "two")
    train(tmp, tmp / "plain.mplan", 1, "--probe-db", two, "--probe-run", "second", tag="two")
    cases = [([str(not_db), str(s["plain"])], "not a MegaScope probe store"),
             ([str(two), str(s["plain"])], "holds 2 runs"),
             ([str(s["fewer"]), str(s["plain"])], "the stores record different samples"),
             ([str(s["plain"]), str(s["plain"]), "--step", "5"], "no scalar probe samples at step 5"),
             ([str(s["plain"]), str(s["plain"]), "--threshold", "0"], "--threshold must be positive")]
    for argv, message in cases:
        r = subprocess.run([sys.executable, "-m", "mapp.probe_diff", *argv],
                           capture_output=True, text=True)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert message in r.stderr, (argv, r.stderr)

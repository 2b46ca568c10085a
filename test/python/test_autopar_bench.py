"""bench/autopar/run.py's staged path without the compiler: the measure
stage against a stand-in mapp-run whose step times are known (the plan
file names them), and the analysis' criteria and merging on closed forms."""

import importlib.util
import json
import lzma
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_PY = os.path.join(ROOT, "bench", "autopar", "run.py")

spec = importlib.util.spec_from_file_location("autopar_run", RUN_PY)
autopar = importlib.util.module_from_spec(spec)
spec.loader.exec_module(autopar)

# Writes --metrics with one line per step: the plan's base time, +7 ms per
# --inject flag, the first step at half of it (a step that must not count:
# the bench takes the fastest step after the first); fails unless --threads 1,
# and for a plan that says "fail"; --calibrate writes a profile of two GEMM
# rates by size, the small one divided by the number of calibrations that
# started within its first two seconds (a marker file each, kept): copies run at
# once see each other.
FAKE_RUN = r'''#!{python} -S
import glob, json, os, sys, time
a = sys.argv[1:]
assert a[a.index("--threads") + 1] == "1", "every rank one thread"
if a[0] == "--calibrate":
    o = a[a.index("-o") + 1]
    open(o + ".running", "w").close()
    time.sleep(2.0)
    n = len(glob.glob(os.path.join(os.path.dirname(o), "*.running")))
    json.dump({"device": "cpu", "gemm_tflops": {"f32": 0.1}, "mem_gbps": 6,
               "gemm_rates": {"f32": [[32, 0.05 / n], [512, 0.1]]}},
              open(o, "w"))
    sys.exit(0)
text = open(a[0]).read()
if text == "fail":
    sys.exit("a failing layout")
base = float(text)
steps = int(a[a.index("--steps") + 1])
ms = base + 7 * a.count("--inject")
with open(a[a.index("--metrics") + 1], "w") as f:
    for s in range(steps):
        f.write(json.dumps({"step": s, "step_ms": ms * (0.5 if s == 0 else 1)}) + "\n")
'''


def write_plan(d, rel, ms):
    os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
    with lzma.open(os.path.join(d, rel), "wb") as f:
        f.write(str(ms).encode())


def test_measure_stage_with_stand_in_runner(tmp_path):
    d = tmp_path / "dir"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mapp-run"
    fake.write_text(FAKE_RUN.replace("{python}", sys.executable))
    fake.chmod(0o755)
    probes = {}
    for key, ms in (("mbs2", 2.0), ("mbs16", 20.0), ("dp8", 5.0), ("dp8w", 9.0),
                    ("tp2", 6.0)):
        probes[key] = f"plans/probe-{key}.mplan.xz"
        write_plan(d, probes[key], ms)
    layouts = []
    for name, pp, ms in (("tp1 pp1 dp8 mbs2x1 1f1b", 1, 30.0),
                         ("tp1 pp2 dp4 mbs2x2 1f1b", 2, 40.0),
                         ("tp2 pp1 dp4 mbs2x2 1f1b", 1, "fail")):
        rel = f"plans/gpt-a/{autopar.layout_file(name)}.mplan.xz"
        write_plan(d, rel, ms)
        layouts.append({"layout": name, "pp": pp, "plan": rel})
    manifest = {"world": autopar.WORLD, "global_batch": autopar.BATCH,
                "commit": "test", "data": autopar.DATA,
                "data_sha256": autopar.hashlib.sha256(
                    open(os.path.join(ROOT, autopar.DATA), "rb").read()).hexdigest(),
                "probes": probes, "models": {"gpt-a": {"layouts": layouts}}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "measured.json"
    r = subprocess.run([sys.executable, RUN_PY, "--stage", "measure", str(d),
                        "--comm", "local", "--models", "gpt-a", "--steps", "3",
                        "--rounds", "2", "--inject-gbps", "0.5", "--probe-every", "2",
                        "--bin", str(bin_dir), "--measured", str(out)],
                       capture_output=True, text=True, timeout=60)
    # The failing layout is tried twice a round, reported, and costs the
    # others nothing.
    assert r.returncode != 0
    assert "2 runs failed twice: gpt-a local inject 0 tp2 pp1 dp4 mbs2x2 1f1b round 1" \
        in r.stderr, r.stderr
    m = json.loads(out.read_text())
    assert m["complete"] and m["rounds"] == 2
    # The host's kernel rates, once, for analyze to shape the profile with.
    rates = autopar.kernel_rates(autopar.argparse.Namespace(rates_from=None), m)
    assert rates == {"gemm_tflops": {"f32": 0.1}, "mem_gbps": 6,
                     "gemm_rates": {"f32": [[32, 0.05], [512, 0.1]]}}
    # ... and as one copy per rank's core at once, after it (the alone
    # run's marker stays): --probe-load's shape.
    copies = min(autopar.WORLD, m["host"]["cpus"])
    loaded = autopar.kernel_rates(autopar.argparse.Namespace(rates_from=None, probe_load=True), m)
    assert loaded["gemm_rates"]["f32"] == [[32, 0.05 / (1 + copies)], [512, 0.1]]
    # Two rounds, the fastest step after the first.
    assert m["layouts"]["gpt-a/local/0"] == {"tp1 pp1 dp8 mbs2x1 1f1b": [30.0, 30.0],
                                             "tp1 pp2 dp4 mbs2x2 1f1b": [40.0, 40.0]}
    # Injected: only the pipeline layout (pp = 1 has no point-to-point
    # link), 56 directed links' flags.
    assert m["layouts"]["gpt-a/local/0.5"] == {
        "tp1 pp2 dp4 mbs2x2 1f1b": [40.0 + 7 * 56] * 2}
    # Probes before runs 1 and 3 of each 4-run round, and once at the end.
    assert m["probes"]["mbs16"] == [20.0] * 5
    assert m["probes"]["dp8w_local"] == [9.0] * 5
    assert m["probes"]["mbs2_loaded"] == [2.0] * 5
    assert m["probes"]["tp2_local"] == [6.0] * 5
    assert "pp2_local" not in m["probes"]  # not compiled: skipped
    # --resume: the runs measured already are not repeated in the first round.
    out2 = tmp_path / "measured2.json"
    r = subprocess.run([sys.executable, RUN_PY, "--stage", "measure", str(d),
                        "--comm", "local", "--models", "gpt-a", "--steps", "3",
                        "--rounds", "1", "--inject-gbps", "0.5", "--resume", str(out),
                        "--bin", str(bin_dir), "--measured", str(out2)],
                       capture_output=True, text=True, timeout=60)
    m2 = json.loads(out2.read_text())
    assert r.returncode != 0 and "1 runs failed twice" in r.stderr, r.stderr  # the failing one
    assert m2["layouts"]["gpt-a/local/0"] == m["layouts"]["gpt-a/local/0"]
    assert m2["probes"]["mbs16"] == [20.0] * 7  # one sample before the run, one after
    # A call over its budget in the first round stops after the run in
    # flight, keeps what it measured, and --resume measures only the rest.
    cut = tmp_path / "cut.json"
    base = [sys.executable, RUN_PY, "--stage", "measure", str(d), "--comm", "local",
            "--models", "gpt-a", "--steps", "3", "--bin", str(bin_dir)]
    r = subprocess.run(base + ["--rounds", "2", "--budget-s", "0.001", "--measured", str(cut)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "over the budget" in r.stderr, r.stderr
    c = json.loads(cut.read_text())
    assert not c["complete"]
    assert c["layouts"] == {"gpt-a/local/0": {"tp1 pp1 dp8 mbs2x1 1f1b": [30.0]}}
    rest = tmp_path / "rest.json"
    r = subprocess.run(base + ["--rounds", "1", "--resume", str(cut), "--measured", str(rest)],
                       capture_output=True, text=True, timeout=60)
    assert "resumed: 1 of 3 runs measured already" in r.stderr, r.stderr
    assert json.loads(rest.read_text())["layouts"]["gpt-a/local/0"] == {
        "tp1 pp1 dp8 mbs2x1 1f1b": [30.0], "tp1 pp2 dp4 mbs2x2 1f1b": [40.0]}


def test_measure_stage_rejects_unknown_model(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({
        "world": autopar.WORLD, "global_batch": autopar.BATCH, "commit": "t",
        "data_sha256": autopar.hashlib.sha256(
            open(os.path.join(ROOT, autopar.DATA), "rb").read()).hexdigest(),
        "probes": {}, "models": {"gpt-a": {"layouts": []}}}))
    (tmp_path / "mapp-run").write_text("#!/bin/sh\n")
    (tmp_path / "mapp-run").chmod(0o755)
    r = subprocess.run([sys.executable, RUN_PY, "--stage", "measure", str(d),
                        "--comm", "local", "--models", "gpt-z", "--bin", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "gpt-z: not compiled" in r.stderr


def test_criteria_closed_forms():
    rows = [{"layout": "a", "predicted_ms": 10.0, "measured_ms": 11.5},  # chosen, -13%
            {"layout": "b", "predicted_ms": 12.0, "measured_ms": 10.0},  # best, +20%
            {"layout": "c", "predicted_ms": 13.0, "measured_ms": 20.0}]  # -35%
    c = autopar.criteria(rows)
    assert (c["chosen"], c["best"]) == ("a", "b")
    assert c["chosen_over_best"] == pytest.approx(0.15)
    assert not c["choice_pass"]
    assert c["within_20pct"] == 2 and not c["prediction_pass"]  # 2 of 3 < 90%
    rows[0]["measured_ms"] = 10.9
    rows[2]["measured_ms"] = 14.0
    c = autopar.criteria(rows)
    assert c["choice_pass"] and c["prediction_pass"] and c["within_20pct"] == 3


def test_merge_of_split_measurements(tmp_path):
    def part(name, cpus, probes, layouts):
        f = tmp_path / name
        f.write_text(json.dumps({"host": {"cpus": cpus}, "complete": True, "inject_gbps": 0,
                                 "comms": ["local"], "models": list(layouts),
                                 "probes": probes,
                                 "layouts": {f"{m}/local/0": v for m, v in layouts.items()}}))
        return str(f)
    a = part("a.json", 16, {"mbs2": [3.0]}, {"gpt-a": {"x": [5.0]}})
    b = part("b.json", 16, {"mbs2": [2.5]}, {"gpt-b": {"y": [7.0]}})
    m = autopar.load_measured([a, b])
    assert m["probes"]["mbs2"] == [3.0, 2.5]
    assert m["models"] == ["gpt-a", "gpt-b"]
    assert m["layouts"]["gpt-b/local/0"] == {"y": [7.0]}
    c = part("c.json", 2, {}, {"moe-a": {}})
    with pytest.raises(SystemExit, match="2 CPUs"):
        autopar.load_measured([a, c])

"""The mapp-scope page in headless Chromium (Debian's chromium driven by
playwright-core): the views render from a store a running job writes, and a
switch flipped in the page reaches that job, which logs when it applied it."""

import json
import os
import shutil
import sqlite3
import subprocess
import time

import pytest

from conftest import ROOT
from conftest import require_tool
from scope_ref import CORPUS, compile_plan, export

BROWSER_DIR = os.path.join(ROOT, "test", "Tools", "mapp-scope", "browser")
SPEC = {
    "probes": [
        {"name": "layers.*.mlp.fc1", "reduce": ["mean", "std", "hist"], "bins": 16,
         "range": [-1, 1]},
        {"name": "layers.*.attn.probs", "reduce": ["attn"]},
        {"name": "layers.*", "reduce": ["sketch"], "dim": 4},
    ],
    "perturbations": [
        {"name": "layers.0.mlp.fc1", "kind": "gaussian", "magnitude": 0.1,
         "enabled": False, "seed": 1},
    ],
}


def wait_for(fn, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_page_renders_and_controls_the_job(tmp_path):
    if not shutil.which("node") or not os.path.exists("/usr/bin/chromium"):
        pytest.skip("node or Debian chromium missing (scripts/setup.sh installs them)")
    if not os.path.isdir(os.path.join(BROWSER_DIR, "node_modules", "playwright-core")):
        pytest.skip("playwright-core not installed (scripts/setup.sh installs it)")
    export(tmp_path)
    plan = compile_plan(tmp_path, SPEC)
    db = tmp_path / "scope.sqlite"
    job = subprocess.Popen(
        [require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", "1000000", "--weights", tmp_path / "init.safetensors",
         "--probe-db", db, "--probe-control", "0", "--probe-run", "live", "--quiet"])
    server = None
    try:
        def steps():
            try:
                return sqlite3.connect(db, timeout=10).execute(
                    "SELECT count(*) FROM steps").fetchone()[0] >= 3
            except sqlite3.OperationalError:
                return False
        wait_for(steps, "the job's first steps")
        server = subprocess.Popen([require_tool("mapp-scope"), "serve", "--db", db, "--port", "0"],
                                  stdout=subprocess.PIPE, text=True)
        line = server.stdout.readline()
        assert line.startswith("mapp-scope: serving http://127.0.0.1:"), line
        url = line.split()[-1]
        assert "/?token=" in url  # the page trades it for an HttpOnly cookie
        shot = os.environ.get("MAPP_SCOPE_SCREENSHOT", str(tmp_path / "page.png"))
        r = subprocess.run(["node", "scope-page.mjs", url, shot],
                           cwd=BROWSER_DIR, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert res["errors"] == []
        assert res["lossPoints"] >= 3 and res["statPoints"] >= 3
        assert res["histBars"] == 16
        assert res["heatCells"] == 8 * 8
        assert res["pcaPoints"] == 2 * 2 * 8  # 2 layers x B=2 x T=8 rows
        assert res["switches"] == 1 and res["switchOn"] is False
        # The job applied the UI's change between two steps and logged it.
        log = sqlite3.connect(db, timeout=10).execute(
            "SELECT switch_id, enabled, magnitude, source FROM control_log").fetchall()
        assert log == [(0, 1, 0.75, "tcp")]
        assert res["controlRow"][1:] == ["0", "on", "0.75", "tcp"]
    finally:
        if server:
            server.terminate()
            server.wait(timeout=30)
        job.terminate()
        job.wait(timeout=30)

"""Every view of MegaScope's Vite/ECharts page in Debian's headless Chromium
(playwright-core), against a store written by real mapp-run runs: a CPU
training run with statistics, raw, attention and sketch probes; a greedy
generation with logit-lens and attention probes; a tp=2 pp=2 run. The page's
token labels, hover texts and tables are compared with the store's rows
(token texts from its vocabulary), the patch started from the form with
mapp-run --patch run directly, and every rank of the parallel run is
selectable. Screenshots of each view: MAPP_SCOPE_SHOTS=DIR."""

import json
import os
import re
import shutil
import sqlite3
import subprocess

import numpy as np
import pytest

from conftest import ROOT
from conftest import require_tool
from scope_ref import CORPUS, compile_plan, export, run

BROWSER_DIR = os.path.join(ROOT, "test", "Tools", "mapp-scope", "browser")
TRAIN_SPEC = {
    "probes": [
        {"name": "layers.*.mlp.fc1", "reduce": ["mean", "std", "hist"], "bins": 16, "range": [-1, 1]},
        {"name": "layers.0.mlp.fc1", "reduce": ["raw"]},
        {"name": "layers.*.attn.probs", "reduce": ["attn"]},
        {"name": "layers.*", "reduce": ["sketch"], "dim": 4},
    ],
    "perturbations": [{"name": "layers.0.mlp.fc1", "kind": "gaussian", "magnitude": 0.1,
                       "enabled": False, "seed": 1}],
}
GEN_SPEC = {"probes": [{"name": "layers.*", "reduce": ["lens"], "k": 5},
                       {"name": "layers.*.attn.probs", "reduce": ["attn"]}]}
PP_SPEC = {"probes": [{"name": "layers.*.mlp.fc1", "reduce": ["mean", "absmax"]},
                      {"name": "layers.*.attn.probs", "reduce": ["attn"]}]}
PROMPT = "The m"


def label(text, tid):
    """api.js tokenLabel, re-implemented."""
    if text is None:
        return f"#{tid}"
    if text == "":
        return "∅"
    if re.fullmatch("\ufffd+", text):
        return f"⟨#{tid}⟩"
    text = text.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥")
    return re.sub("[\x00-\x1f\x7f]", "·", text)


def floats(tip):
    return [float(x) for x in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", tip)]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if not shutil.which("node") or not os.path.exists("/usr/bin/chromium"):
        pytest.skip("node or Debian chromium missing (scripts/setup.sh installs them)")
    if not os.path.isdir(os.path.join(BROWSER_DIR, "node_modules", "playwright-core")):
        pytest.skip("playwright-core not installed (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("scopeui")
    export(d)
    db = d / "scope.sqlite"
    w = d / "init.safetensors"
    plan = compile_plan(d, TRAIN_SPEC, name="train")
    run([require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", 4,
         "--weights", w, "--probe-db", db, "--probe-run", "train", "--quiet"])
    gen = compile_plan(d, GEN_SPEC, name="gen")
    run([require_tool("mapp-run"), gen, "--generate", "--prompt", PROMPT, "--max-new-tokens", 3,
         "--greedy", "--weights", w, "--tokenizer", "bytes", "--probe-db", db,
         "--probe-run", "generate", "--quiet"])
    (d / "pp.json").write_text(json.dumps(PP_SPEC))
    run([require_tool("mapp-opt"), d / "model.mlir", f"-mapp-insert-probes=spec={d / 'pp.json'}",
         "--mapp-train-pipeline=tp=2 pp=2 dp=1 microbatches=2 schedule=1f1b lr=1e-3",
         "-o", d / "pp.mlir"])
    run([require_tool("mapp-translate"), "--mapp-to-plan", d / "pp.mlir", "-o", d / "pp.mplan"])
    run([require_tool("mapp-run"), d / "pp.mplan", "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", 3, "--weights", w, "--probe-db", db, "--probe-run", "tp2pp2",
         "--comm=local", "--threads", 1, "--quiet"])
    patch_plan = compile_plan(d, None, name="plain")
    server = subprocess.Popen([require_tool("mapp-scope"), "serve", "--db", db, "--port", "0",
                               "--patch-plan", patch_plan, "--patch-weights", w],
                              stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("mapp-scope: serving http://127.0.0.1:"), line
        shots = os.environ.get("MAPP_SCOPE_SHOTS", str(d / "shots"))
        os.makedirs(shots, exist_ok=True)
        r = subprocess.run(["node", "scope-views.mjs", line.split()[-1], shots],
                           cwd=BROWSER_DIR, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        page = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    con = sqlite3.connect(db)
    # A byte token is not UTF-8 by itself: mapp-scope's JSON replaces it
    # with U+FFFD, as this decoder does.
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    runs = dict(con.execute("SELECT name, id FROM runs"))
    vocab = {(rid, i): t for rid, i, t in con.execute("SELECT run_id, id, text FROM vocab")}
    return {"page": page, "con": con, "runs": runs, "vocab": vocab, "d": d, "plan": patch_plan}


def probe_id(s, run, point, red=None):
    """The probe at `point` (recording `red`: one point may have several)."""
    for pid, reduce in s["con"].execute(
            "SELECT probe_id, reduce FROM probes WHERE run_id=? AND point=? ORDER BY probe_id",
            (run, point)):
        if red is None or red in reduce.split(","):
            return pid
    raise AssertionError(f"no probe {point} {red}")


def context(s, run, step, phase, rank=0):
    ids = json.loads(s["con"].execute(
        "SELECT tokens FROM contexts WHERE run_id=? AND step=? AND phase=? AND rank=?",
        (run, step, phase, rank)).fetchone()[0])
    return [label(s["vocab"].get((run, i)), i) for i in ids]


def sample(s, run, point, red, phase="train", rank=0, step=None):
    q = ("SELECT step, data FROM samples WHERE run_id=? AND probe_id=? AND reduction=? "
         "AND phase=? AND rank=? AND microbatch=0 ")
    args = [run, probe_id(s, run, point, red), red, phase, rank]
    if step is None:
        q += "ORDER BY step DESC LIMIT 1"
    else:
        q += "AND step=?"
        args.append(step)
    st, data = s["con"].execute(q, args).fetchone()
    return st, np.frombuffer(data, np.float32)


def test_page_has_no_errors_and_csp(store):
    p = store["page"]
    assert p["errors"] == []
    assert "script-src 'self'" in p["csp"] and "unsafe" not in p["csp"]
    assert [r.split()[1] for r in p["runs"]] == ["train", "generate", "tp2pp2"]


def test_loss_and_statistics_with_zoom(store):
    p, con, run = store["page"], store["con"], store["runs"]["train"]
    assert p["lossCount"] == 4
    loss = con.execute("SELECT loss FROM steps WHERE run_id=? AND step=2", (run,)).fetchone()[0]
    assert p["lossTip"].startswith("rank 0 (dp0 pp0 tp0) step 2:")
    assert abs(floats(p["lossTip"])[-1] - loss) <= 1e-5 * abs(loss)
    assert p["statCount"] == 4
    mean = con.execute("SELECT avg(value) FROM samples WHERE run_id=? AND probe_id=? AND "
                       "reduction='mean' AND step=1", (run, probe_id(store, run, "layers.0.mlp.fc1"))).fetchone()[0]
    assert "step 1:" in p["statTip"]
    assert abs(floats(p["statTip"])[-1] - mean) <= 1e-5 * abs(mean) + 1e-9
    assert p["statZoom"][0] > 0  # zoomed to the later half of steps 0..3


def test_token_heatmap(store):
    p, run = store["page"], store["runs"]["train"]
    step, raw = sample(store, run, "layers.0.mlp.fc1", "raw")
    toks = context(store, run, step, "train")
    assert p["heatY"] == toks[:8]
    assert p["heatCount"] == 8 * 64
    assert p["heatTip"].startswith(f"token {toks[2]} (pos 2)\nchannel 3:")
    assert abs(floats(p["heatTip"])[-1] - raw[2 * 64 + 3]) <= 1e-5 * abs(raw[2 * 64 + 3]) + 1e-9


def test_attention_with_token_axes(store):
    p, run = store["page"], store["runs"]["train"]
    step, attn = sample(store, run, "layers.0.attn.probs", "attn")
    toks = context(store, run, step, "train")
    assert p["attnInfo"] == f"layers.0.attn.probs head 1, train step {step}"
    assert p["attnX"] == toks[:8]
    assert p["attnTip"].startswith(f"query {toks[5]} (pos 5)\nkey {toks[1]} (pos 1)")
    want = attn.reshape(2, 8, 8)[1, 5, 1]
    assert abs(floats(p["attnTip"])[-1] - want) <= 1e-5


def test_pca_and_histogram(store):
    p, run = store["page"], store["runs"]["train"]
    assert p["pcaCount"] == 2 * 2 * 8  # 2 layers x B=2 x T=8 rows
    step = int(re.search(r"step (\d+)", p["pcaInfo"]).group(1))
    toks = context(store, run, step, "train")
    assert p["pcaPoint"][2] == 3
    assert f"token {toks[3]}" in p["pcaTip"] and "layers.0 row 3" in p["pcaTip"]
    got = json.loads(run_get(store, f"/api/pca?run={run}&step={step}"))
    pt = [q for q in got["points"] if q["point"] == "layers.0" and q["row"] == 3][0]
    assert np.allclose(floats(p["pcaTip"])[-2:], [pt["x"], pt["y"]], rtol=1e-5, atol=1e-7)
    assert p["histCount"] == 16 and p["switches"] == 1


def run_get(store, path):
    return run([require_tool("mapp-scope"), "get", "--db", store["d"] / "scope.sqlite", path]).stdout


def test_logit_lens_grid(store):
    p, con, run = store["page"], store["con"], store["runs"]["generate"]
    toks = context(store, run, 0, "generate")
    assert toks == [label(c, ord(c)) for c in PROMPT]
    assert p["lensY"] == ["layers.0", "layers.1"]
    assert p["lensX"] == toks + ["pos 5", "pos 6", "pos 7"]  # padding past the prompt
    data, idx = con.execute(
        "SELECT data, idx FROM samples WHERE run_id=? AND probe_id=? AND reduction='lens' AND step=0",
        (run, probe_id(store, run, "layers.1"))).fetchone()
    prob = np.frombuffer(data, np.float32).reshape(8, 5)[4]
    ids = np.frombuffer(idx, np.int64).reshape(8, 5)[4]
    lines = p["lensTip"].splitlines()
    assert lines[0] == f"layers.1, pos 4 {toks[4]}"
    for i, line in enumerate(lines[1:]):
        assert f"#{ids[i]} " in line
        assert line.startswith(f"{i + 1}. {label(store['vocab'][(run, int(ids[i]))], int(ids[i]))} ")
        assert abs(float(line.split("p=")[1]) - prob[i]) <= 1e-6


def test_generation_topk_table(store):
    p, con, run = store["page"], store["con"], store["runs"]["generate"]
    gen = con.execute("SELECT token, text, topk FROM generations WHERE run_id=? ORDER BY position",
                      (run,)).fetchall()
    assert p["genTokens"] == [label(t, i) for i, t, _ in gen]
    topk = json.loads(gen[1][2])
    assert len(p["genTopk"]) == len(topk)
    for row, k in zip(p["genTopk"], topk):
        assert row[1] == label(k["text"], k["id"]) and int(row[2]) == k["id"]
        assert abs(float(row[3]) - k["p"]) <= 1e-5 * k["p"]
    # The decode step's single query row is the newest context token.
    step = int(p["genAttnInfo"].rsplit(" ", 1)[1])
    assert p["genAttnY"] == [context(store, run, step, "generate")[-1]]


def test_patch_started_from_the_page(store):
    p, d = store["page"], store["d"]
    (d / "A.txt").write_text("The cat\n")
    (d / "B.txt").write_text("A dog r\n")
    want = json.loads(run([require_tool("mapp-run"), store["plan"], "--weights", d / "init.safetensors",
                           "--patch", f"into={d / 'A.txt'},from={d / 'B.txt'},site=attn,"
                           "layer=1,pos=6,target=a"]).stdout)
    site, layer, pos, target, clean, patched, delta = p["patchRow"]
    assert (site, layer, pos, target) == ("attn", "1", "6", "a #97")
    for got, key in [(clean, "clean_logit"), (patched, "patched_logit"), (delta, "delta")]:
        assert abs(float(got) - want[key]) <= 1e-5 * max(1.0, abs(want[key]))
    assert "not a dotted name" in p["patchBad"]["error"]


def test_every_tp_and_pp_rank_selectable(store):
    p, con, run = store["page"], store["con"], store["runs"]["tp2pp2"]
    coords = con.execute("SELECT rank, dp, pp, tp FROM ranks WHERE run_id=? ORDER BY rank",
                         (run,)).fetchall()
    assert p["rankOptions"] == [f"rank {r} (dp{a} pp{b} tp{c})" for r, a, b, c in coords]
    assert len(coords) == 4
    # layers.1 lives on the second stage: its statistics come from ranks 2, 3.
    assert p["ppStatSeries"] == ["rank 2 (dp0 pp1 tp0)", "rank 3 (dp0 pp1 tp1)"]
    assert p["rank3AttnProbes"] == ["layers.1.attn.probs"]
    step, attn = sample(store, run, "layers.1.attn.probs", "attn", rank=3)
    assert p["rank3AttnInfo"].endswith(f"train step {step}")
    heads = attn.size // 64
    h = min(1, heads - 1)
    want = attn.reshape(heads, 8, 8)[h, 4, 2]
    assert abs(floats(p["rank3AttnTip"])[-1] - want) <= 1e-5


def test_serve_needs_a_built_ui_and_both_patch_flags(store):
    db = store["d"] / "scope.sqlite"
    r = subprocess.run([require_tool("mapp-scope"), "serve", "--db", db, "--port", "0",
                        "--web", store["d"] / "no-such-web"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no web UI in" in r.stderr and "mapp-scope-web" in r.stderr
    r = subprocess.run([require_tool("mapp-scope"), "serve", "--db", db, "--patch-plan", store["plan"]],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--patch-plan and --patch-weights go together" in r.stderr
    # Without them the page's patch form is off, and a POST says how to turn it on.
    r = subprocess.run([require_tool("mapp-scope"), "post", "--db", db, "/api/patch",
                        json.dumps({"into": "a", "from": "b", "site": "resid", "layer": 0,
                                    "pos": 0, "target": "a"})], capture_output=True, text=True)
    assert r.returncode == 1 and "--patch-plan PLAN --patch-weights W" in r.stdout
    off = json.loads(run_get(store, "/api/patches"))
    assert off == {"enabled": False, "results": []}

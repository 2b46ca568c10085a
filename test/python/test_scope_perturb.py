"""Perturbations with known answers: a constant offset on an op's output (fc1,
before the GELU: an offset on a residual branch would vanish in LayerNorm)
changes the loss exactly as PyTorch predicts for the same offset; switched
off, the run is bit-identical to an unperturbed one; switches turned on
through the control file or the control port take effect between steps."""

import json
import socket
import sqlite3
import subprocess
import time

import pytest
import torch

from mapp import safetensors
from mapp.reference import GPT
from conftest import require_tool
from scope_ref import CORPUS, TINY, compile_plan, export, train

OFFSET = 0.25


def spec(enabled):
    return {"perturbations": [{"name": "layers.0.mlp.fc1", "kind": "offset",
                               "magnitude": OFFSET, "enabled": enabled}]}


def torch_losses(tmp, batches, offset):
    model = GPT(TINY)
    model.load_state_dict(safetensors.load(tmp / "init.safetensors")[0])
    model.layers[0].mlp.fc1.register_forward_hook(lambda m, i, o: o + offset)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                            eps=1e-8, weight_decay=0.1)
    out = []
    for b in batches:
        opt.zero_grad()
        loss = model(torch.tensor(b["tokens"]), torch.tensor(b["targets"]))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_offset_matches_torch_and_off_is_identity(tmp_path):
    export(tmp_path)
    on = compile_plan(tmp_path, spec(True), name="on")
    off = compile_plan(tmp_path, spec(False), name="off")
    plain = compile_plan(tmp_path, None, name="plain")
    m_on, batches = train(tmp_path, on, 3, tag="on")
    m_off, _ = train(tmp_path, off, 3, tag="off")
    m_plain, _ = train(tmp_path, plain, 3, tag="plain")
    want = torch_losses(tmp_path, batches, OFFSET)
    for got, w in zip(m_on, want):
        assert got["loss"] == pytest.approx(w, rel=1e-5)
    assert m_on[0]["loss"] != m_plain[0]["loss"]
    # Off: the same numbers bit for bit as a plan without the perturbation.
    assert [m["loss"] for m in m_off] == [m["loss"] for m in m_plain]
    assert [m["grad_norm"] for m in m_off] == [m["grad_norm"] for m in m_plain]


def test_control_file_switches_between_steps(tmp_path):
    export(tmp_path)
    off = compile_plan(tmp_path, spec(False), name="off")
    on = compile_plan(tmp_path, spec(True), name="on")
    ctl = tmp_path / "control.json"
    ctl.write_text(json.dumps({"switches": [{"id": 0, "enabled": True,
                                             "magnitude": OFFSET}]}))
    db = tmp_path / "p.sqlite"
    m_ctl, _ = train(tmp_path, off, 2, "--probe-control", ctl, "--probe-db", db, tag="ctl")
    m_on, _ = train(tmp_path, on, 2, tag="on")
    assert [m["loss"] for m in m_ctl] == [m["loss"] for m in m_on]
    con = sqlite3.connect(db)
    assert con.execute("SELECT step, switch_id, enabled, magnitude, source FROM "
                       "control_log").fetchall() == [(0, 0, 1, OFFSET, "file")]
    assert con.execute("SELECT enabled, magnitude FROM switches").fetchall() == [(1, OFFSET)]


def test_control_port_reaches_the_running_job(tmp_path):
    export(tmp_path)
    off = compile_plan(tmp_path, spec(False), name="off")
    db = tmp_path / "p.sqlite"
    job = subprocess.Popen(
        [require_tool("mapp-run"), off, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", "100000", "--weights", tmp_path / "init.safetensors",
         "--probe-db", db, "--probe-control", "0", "--quiet"])
    try:
        # The job records its bound control port in the run's metadata.
        deadline, endpoint = time.time() + 30, ""
        while time.time() < deadline and not endpoint:
            time.sleep(0.1)
            try:
                row = sqlite3.connect(db, timeout=10).execute(
                    "SELECT meta FROM runs").fetchone()
                endpoint = json.loads(row[0])["control"] if row else ""
            except sqlite3.OperationalError:
                pass  # the job is still creating the tables
        assert endpoint.startswith("tcp:127.0.0.1:"), endpoint
        port = int(endpoint.rsplit(":", 1)[1])
        # The token is in a file only the user can read, beside the store.
        cred_file = tmp_path / "p.sqlite.control-token"
        assert cred_file.stat().st_mode & 0o777 == 0o600
        cred = json.loads(cred_file.read_text())
        assert cred["port"] == port and len(cred["token"]) == 64

        def ask(req):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall((json.dumps(dict(req, token=cred["token"])) + "\n").encode())
                return json.loads(s.makefile().readline())
        assert ask({"op": "set", "switch": 3, "enabled": True}) == {
            "ok": False, "error": "no perturbation switch 3 in this plan"}
        assert ask({"op": "set", "switch": 0, "enabled": "yes"})["ok"] is False
        assert ask({"op": "set", "switch": 0, "enabled": True, "magnitude": 2.0}) == {"ok": True}
        con = sqlite3.connect(db, timeout=10)
        deadline = time.time() + 30
        rows = []
        while time.time() < deadline and not rows:
            rows = con.execute("SELECT step, enabled, magnitude, source FROM control_log").fetchall()
            time.sleep(0.1)
        assert len(rows) == 1 and rows[0][1:] == (1, 2.0, "tcp")
        state = ask({"op": "state"})
        assert state["switches"][0]["enabled"] is True and state["step"] >= rows[0][0]
        # The loss after the switch reflects the offset: compare the steps
        # around it with a run that had the offset from the start.
        applied = rows[0][0]
        deadline = time.time() + 30
        while time.time() < deadline:
            n = con.execute("SELECT count(*) FROM steps WHERE step > ?", (applied,)).fetchone()[0]
            if n:
                break
            time.sleep(0.1)
    finally:
        job.terminate()
        job.wait(timeout=30)

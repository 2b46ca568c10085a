"""mapp-run's control port and probe store against hostile or broken
clients (docs/megascope.md, "Security"): the port needs the token from a
0600 file (never written through a planted link); a request without it is
refused and logged while the job goes on; a client that sends half a
request and resets the connection, or one that trickles bytes, neither
kills the job nor blocks other clients; clients that reconnect in a loop
cannot lock the port out (the oldest waiting connection gives way);
magnitudes have bounds; and
--probe-db on a foreign SQLite file is an error that leaves it
byte-identical."""

import hashlib
import json
import os
import socket
import sqlite3
import struct
import subprocess
import threading
import time

import pytest

from conftest import require_tool
from scope_ref import CORPUS, compile_plan, export

SPEC = {"perturbations": [
    {"name": "layers.0.mlp.fc1", "kind": "gaussian", "magnitude": 0.1, "enabled": False},
    {"name": "layers.0.mlp.fc2", "kind": "uniform", "magnitude": 0.1, "enabled": False}]}


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ctl")
    export(tmp)
    return tmp, compile_plan(tmp, SPEC, name="ctl")


def start(tmp, plan, steps, weights):
    """A job with a control port; returns it once its token file exists."""
    token_file = tmp / "ctl.token"
    job = subprocess.Popen(
        [require_tool("mapp-run"), plan, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", str(steps), "--weights", weights,
         "--probe-control", "0", "--probe-control-token-file", token_file,
         "--quiet"],
        stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not token_file.exists():
        assert job.poll() is None, job.stderr.read()
        time.sleep(0.05)
    assert token_file.exists(), "the job wrote no token file"
    return job, token_file


def ask(port, req, token=None, timeout=10):
    if token:
        req = dict(req, token=token)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall((json.dumps(req) + "\n").encode())
        return json.loads(s.makefile().readline())


def reset(sock):
    # SO_LINGER 0: close() sends RST instead of FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_token_file_is_private_and_required(plan, tmp_path):
    tmp, mplan = plan
    # A link planted where the token goes: the job must not write through it.
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "ctl.token")
    token_file = tmp_path / "ctl.token"
    # start() waits for the file to exist: the planted link already does, so
    # wait for the job to have replaced it with a regular file instead.
    job = subprocess.Popen(
        [require_tool("mapp-run"), mplan, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", "100000", "--weights", tmp / "init.safetensors",
         "--probe-control", "0", "--probe-control-token-file", token_file, "--quiet"],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and os.path.islink(token_file):
            assert job.poll() is None, job.stderr.read()
            time.sleep(0.05)
        time.sleep(0.2)
        assert victim.read_text() == "precious"
        st = os.lstat(token_file)
        assert not os.path.islink(token_file) and st.st_mode & 0o777 == 0o600
        cred = json.loads(token_file.read_text())
        port, token = cred["port"], cred["token"]
        # No token, a wrong one: refused, logged; the job goes on.
        assert ask(port, {"op": "state"})["ok"] is False
        r = ask(port, {"op": "set", "switch": 0, "enabled": True}, token="f" * 64)
        assert r["ok"] is False and "unauthorized" in r["error"]
        assert ask(port, {"op": "state"}, token)["ok"] is True
        assert job.poll() is None
    finally:
        job.terminate()
        _, err = job.communicate(timeout=30)
    assert err.count("without the right token") == 2, err


def test_partial_request_and_reset_do_not_kill_the_job(plan, tmp_path):
    tmp, mplan = plan
    # 4000 steps: seconds of training on an idle machine, against tens of
    # milliseconds of attack started before step 0.
    job, token_file = start(tmp_path, mplan, 4000, tmp / "init.safetensors")
    cred = json.loads(token_file.read_text())
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", cred["port"]), timeout=5)
        s.sendall(b'{"op": "se')
        time.sleep(0.01)
        reset(s)
    s = socket.create_connection(("127.0.0.1", cred["port"]), timeout=5)
    reset(s)  # connect and reset at once
    # Still serving, and the run finishes normally.
    assert ask(cred["port"], {"op": "state"}, cred["token"])["ok"] is True
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    assert "dropped client" in err
    assert not token_file.exists()  # the token dies with the port


def test_a_slow_client_does_not_block_another(plan, tmp_path):
    tmp, mplan = plan
    job, token_file = start(tmp_path, mplan, 100000, tmp / "init.safetensors")
    cred = json.loads(token_file.read_text())
    try:
        slow = socket.create_connection(("127.0.0.1", cred["port"]), timeout=30)
        slow.sendall(b'{"op"')
        # A byte every half second: the old server waited for the slow
        # client's line before looking at anyone else.
        answered = None
        for _ in range(4):
            slow.sendall(b" ")
            if answered is None:
                answered = ask(cred["port"], {"op": "state"}, cred["token"], timeout=20)
            time.sleep(0.5)
        assert answered["ok"] is True
        # The slow client is cut at its deadline (3 s), not left forever.
        slow.settimeout(30)
        t0 = time.time()
        try:
            while slow.recv(4096):
                pass
        except ConnectionResetError:
            pass
        assert time.time() - t0 < 30
        slow.close()
        assert job.poll() is None
    finally:
        job.terminate()
        _, err = job.communicate(timeout=30)
    assert "timed out" in err


def test_reconnecting_clients_do_not_lock_the_port_out(plan, tmp_path):
    """Issue 43, defect 7: 40 clients that connect, send "{" and reconnect
    when cut held the 16 connections the port allowed, and newcomers were
    refused: 46 of 48 valid requests in 12 s ("16 connections already
    open"). For 12 s the same 40 clients while a valid request comes every
    0.25 s: each answered within 1 s. Then 80 silent connections, more
    than the 64 the port holds waiting: the 16 oldest give way (an error
    line), never the newcomer, and a valid request is still answered."""
    tmp, mplan = plan
    job, token_file = start(tmp_path, mplan, 100000, tmp / "init.safetensors")
    cred = json.loads(token_file.read_text())
    port, token = cred["port"], cred["token"]
    stop = threading.Event()

    def reconnecting():
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"{")
                    s.recv(4096)  # until the job cuts it
            except OSError:
                pass

    def timed_state():
        t0 = time.monotonic()
        try:
            ok = ask(port, {"op": "state"}, token, timeout=5)["ok"] is True
        except (OSError, ValueError):
            ok = False  # refused: closed at once, or no answer in 5 s
        return ok, time.monotonic() - t0

    attackers = [threading.Thread(target=reconnecting, daemon=True) for _ in range(40)]
    idle = []
    try:
        for t in attackers:
            t.start()
        time.sleep(0.5)  # all 40 connected
        probes = []
        end = time.monotonic() + 12
        while time.monotonic() < end:
            probes.append(timed_state())
            if sum(not ok or t > 1.0 for ok, t in probes) >= 3:
                break  # locked out: no need to wait out the 12 s
            time.sleep(0.25)
        stop.set()
        for t in attackers:
            t.join(timeout=15)
        bad = [(ok, round(t, 2)) for ok, t in probes if not ok or t > 1.0]
        assert not bad and len(probes) >= 24, (bad, len(probes))

        for _ in range(80):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        ok, took = timed_state()
        assert ok and took < 1.0, (ok, took)
        for c in idle[:16]:
            r = json.loads(c.makefile().readline())
            assert r["ok"] is False and "too many connections" in r["error"], r
        # The 17th oldest also gives way when the valid request's line came
        # after its connection was accepted (it waited too, for a moment);
        # the newer ones are still held (or, on a stalled machine, past
        # their 3 s and closed without a word).
        for i, c in enumerate(idle[16:]):
            c.setblocking(False)
            try:
                got = c.recv(4096)
            except BlockingIOError:
                continue
            assert got == b"" or (i == 0 and b"too many connections" in got), (i, got)
        assert job.poll() is None
    finally:
        stop.set()
        for c in idle:
            c.close()
        job.terminate()
        _, err = job.communicate(timeout=30)
    assert "already open" not in err


def test_magnitude_bounds(plan, tmp_path):
    tmp, mplan = plan
    job, token_file = start(tmp_path, mplan, 100000, tmp / "init.safetensors")
    cred = json.loads(token_file.read_text())
    try:
        for switch, mag, why in [(0, 1e38, "within [-1000, 1000]"),
                                 (0, -0.5, "gaussian"), (1, 1.5, "uniform"),
                                 (0, 1001, "within [-1000, 1000]")]:
            r = ask(cred["port"], {"op": "set", "switch": switch, "magnitude": mag},
                    cred["token"])
            assert r["ok"] is False and "out of bounds" in r["error"] and why in r["error"], r
        assert ask(cred["port"], {"op": "set", "switch": 0, "magnitude": 1000.0},
                   cred["token"]) == {"ok": True}
        assert ask(cred["port"], {"op": "set", "switch": 1, "magnitude": 1.0},
                   cred["token"]) == {"ok": True}
    finally:
        job.terminate()
        job.communicate(timeout=30)
    # The same bounds hold for a plan's own magnitude, at load.
    bad = compile_plan(tmp, {"perturbations": [{"name": "layers.0.mlp.fc1", "kind": "offset",
                                           "magnitude": 1e38}]}, name="huge")
    r = subprocess.run([require_tool("mapp-run"), bad, "--data", CORPUS, "--tokenizer", "bytes",
                        "--steps", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "out of bounds" in r.stderr, r.stderr


def test_port_flag_is_range_checked(plan):
    tmp, mplan = plan
    r = subprocess.run([require_tool("mapp-run"), mplan, "--data", CORPUS, "--tokenizer", "bytes",
                        "--steps", "1", "--probe-control", "99999999999",
                        "--probe-control-token-file", tmp / "t"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not a port (0..65535)" in r.stderr, r.stderr


def test_foreign_probe_db_is_left_untouched(plan, tmp_path):
    tmp, mplan = plan
    foreign = tmp_path / "app.sqlite"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE users(name TEXT, password TEXT)")
    con.execute("INSERT INTO users VALUES('alice', 'x')")
    con.commit()
    con.close()
    before = hashlib.sha256(foreign.read_bytes()).hexdigest()
    r = subprocess.run([require_tool("mapp-run"), mplan, "--data", CORPUS, "--tokenizer", "bytes",
                        "--steps", "1", "--probe-db", foreign, "--probe-control", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "not a mapp probe database" in r.stderr and "no table" in r.stderr, r.stderr
    assert hashlib.sha256(foreign.read_bytes()).hexdigest() == before
    assert sorted(os.listdir(tmp_path)) == ["app.sqlite"]  # no -wal, -shm, token
    con = sqlite3.connect(foreign)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [t for (t,) in con.execute("SELECT name FROM sqlite_master")] == ["users"]


def test_mapp_scope_reaches_the_job_with_its_token(plan, tmp_path):
    # The whole path without a browser: HTTP with the access token ->
    # mapp-scope -> the job's port with the job's token -> control_log.
    tmp, mplan = plan
    db = tmp_path / "p.sqlite"
    job = subprocess.Popen(
        [require_tool("mapp-run"), mplan, "--data", CORPUS, "--tokenizer", "bytes",
         "--steps", "100000", "--weights", tmp / "init.safetensors",
         "--probe-db", db, "--probe-control", "0", "--quiet"],
        stderr=subprocess.PIPE, text=True)
    server = None
    try:
        token_file = tmp_path / "p.sqlite.control-token"
        deadline = time.time() + 60
        def have_run():
            try:
                return sqlite3.connect(db, timeout=10).execute(
                    "SELECT count(*) FROM runs").fetchone()[0] > 0
            except sqlite3.OperationalError:
                return False  # the job is still creating the tables
        while time.time() < deadline and not (token_file.exists() and have_run()):
            time.sleep(0.05)
        server = subprocess.Popen([require_tool("mapp-scope"), "serve", "--db", db, "--port", "0"],
                                  stdout=subprocess.PIPE, text=True)
        url = server.stdout.readline().split()[-1]
        port, token = int(url.split(":")[2].split("/")[0]), url.split("?token=")[1]

        def http(method, path, body=b""):
            head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(head + body)
                out = b""
                while chunk := s.recv(65536):
                    out += chunk
            return json.loads(out.partition(b"\r\n\r\n")[2])
        assert http("POST", "/api/control",
                    b'{"run":1,"switch":0,"enabled":true,"magnitude":0.5}') == {"ok": True}
        assert "out of bounds" in http("POST", "/api/control",
                                       b'{"run":1,"switch":1,"magnitude":2}')["error"]
        live = http("GET", "/api/live?run=1")
        assert live["ok"] is True and len(live["switches"]) == 2
        con = sqlite3.connect(db, timeout=10)
        deadline, rows = time.time() + 30, []
        while time.time() < deadline and not rows:
            rows = con.execute("SELECT switch_id, enabled, magnitude, source "
                               "FROM control_log").fetchall()
            time.sleep(0.1)
        assert rows == [(0, 1, 0.5, "tcp")]
    finally:
        if server:
            server.terminate()
            server.wait(timeout=30)
        job.terminate()
        job.communicate(timeout=30)

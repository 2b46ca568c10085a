"""A first run shows its progress (issue #41): the quick start's long steps
are never silenced, scripts/progress.sh's announcer, heartbeat and Ninja
throttle do what they say, and scripts/build.sh on a non-terminal passes
the build's lines through the throttle (a stand-in cmake; no real build)."""
import os
import re
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPTS = os.path.join(ROOT, "scripts")
PROGRESS = os.path.join(SCRIPTS, "progress.sh")
QUICK_START = ("train-example.sh", "test.sh", "build.sh", "setup.sh")
LONG_STEP = re.compile(r"scripts/(build|setup)\.sh|\bcmake\b|\bninja\b|apt-get (install|update)")
SILENCED = re.compile(r"(&?>|1>)\s*/dev/null")


def bash(script, env=None, timeout=60):
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def commands(path):
    """The script's commands, a backslash-continued command as one line."""
    text = open(path, encoding="utf-8").read().replace("\\\n", " ")
    return [l for l in text.split("\n") if l.strip() and not l.lstrip().startswith("#")]


def test_no_long_step_is_silenced():
    for name in QUICK_START:
        for cmd in commands(os.path.join(SCRIPTS, name)):
            if LONG_STEP.search(cmd) and not cmd.lstrip().startswith("command -v"):
                assert not SILENCED.search(cmd), f"{name}: a long step is silenced: {cmd.strip()}"


def test_package_install_and_build_have_a_heartbeat():
    for name, step in (("setup.sh", "apt-get"), ("build.sh", "cmake")):
        cmds = [c for c in commands(os.path.join(SCRIPTS, name))
                if re.search(rf"\b{step}\b", c)
            and c.split()[0] not in ("command", "announce", "echo", "#")]
        assert cmds, f"{name} runs no {step}"
        for c in cmds:
            assert "with_heartbeat" in c, f"{name}: {c.strip()} has no heartbeat"


def test_announce():
    r = bash(f"source {PROGRESS}; announce compile the model")
    assert re.fullmatch(r"== \[0:0\d\] compile the model\n", r.stdout), r.stdout


def test_heartbeat_while_a_step_runs_and_its_status():
    r = bash(f"source {PROGRESS}; with_heartbeat demo sleep 3.5; echo rc=$?;"
             "with_heartbeat fails false; echo rc=$?", env={"MAPP_HEARTBEAT_S": "1"})
    beats = re.findall(r"   \.\.\. demo: still running \((\d+)s\)\n", r.stdout)
    assert len(beats) >= 1 and "rc=0\n" in r.stdout and r.stdout.endswith("rc=1\n"), r.stdout


def test_heartbeat_ends_with_its_step():
    # With set -e and the output piped: the step's end closes the pipe at
    # once (the heartbeat's pending sleep does not hold it for 30 s).
    start = time.monotonic()
    r = bash(f"set -euo pipefail; source {PROGRESS}; with_heartbeat quick sleep 0.2 | cat;"
             "echo done", env={"MAPP_HEARTBEAT_S": "30"})
    assert r.stdout == "done\n" and time.monotonic() - start < 15


def test_throttle_keeps_first_last_and_other_lines():
    lines = [f"[{i}/40] Building CXX object x{i}.o" for i in range(1, 41)]
    lines.insert(20, "warning: something to read")
    lines.insert(30, "FAILED: y.o")
    r = subprocess.run(["bash", "-c", f"source {PROGRESS}; throttle_progress"],
                       input="\n".join(lines) + "\n", capture_output=True, text=True,
                       timeout=60, env={**os.environ, "MAPP_PROGRESS_S": "3600"})
    assert r.stdout.split("\n")[:-1] == [
        "[1/40] Building CXX object x1.o", "warning: something to read", "FAILED: y.o",
        "[40/40] Building CXX object x40.o"]


def test_build_script_throttles_on_a_non_terminal(tmp_path):
    # A configured build dir and a stand-in cmake that prints Ninja-style
    # progress, a warning and fails: the script's output is thinned, keeps
    # the warning, and its status is the build's.
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "build.ninja").write_text("")
    fake = tmp_path / "bin" / "cmake"
    fake.parent.mkdir()
    fake.write_text("#!/bin/bash\nfor i in $(seq 1 30); do echo \"[$i/31] cc x$i.o\"; done\n"
                    "echo 'x.c:1: warning: w'\necho '[31/31] link'\nexit 3\n")
    fake.chmod(0o755)
    r = subprocess.run([os.path.join(SCRIPTS, "build.sh")], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "MAPP_BUILD_DIR": str(tmp_path / "build"),
                                        "MAPP_PROGRESS_S": "3600",
                                        "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    assert r.returncode == 3, r.stderr
    out = r.stdout.split("\n")
    assert re.fullmatch(r"== \[0:0\d\] build .* with \d+ jobs .*", out[0]), out
    assert out[1:] == ["[1/31] cc x1.o", "x.c:1: warning: w", "[31/31] link", ""], out

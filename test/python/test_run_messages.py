"""Issue 43, defect 10: what mapp-run says about a bad step.

- One numbering of steps: an error names the step the progress lines call
  it (they count from 1), and --inject-nan STEP counts alike, so an injected
  NaN is reported at the step it was injected in, after STEP - 1 progress
  lines (independent reference: the progress lines and metrics records).
- --inject-nan with an op the plan does not have is refused before step 1,
  naming it and the plan's near names (it was silently ignored).
- A refused checkpoint names the op and the tensor in the words of the per-op
  NaN check: "op 'X' (kernel K) wrote V to tensor 'T' at element i of n".

Tools: $MAPP_BIN or build/bin (mapp-run, mapp-make-test-plan).
"""
import re

import pytest

from conftest import read_st
from test_checkpoint import CORPUS, GLOBAL_MB, MAKE_PLAN, MAPP_RUN, MODEL, make_plan, run

pytestmark = pytest.mark.skipif(MAPP_RUN is None or MAKE_PLAN is None,
                                reason="mapp-run / mapp-make-test-plan not built")

# "op 'X' (kernel K[, layer L]) wrote V to tensor 'T'[ (output k)] at element i of n"
NON_FINITE_WRITE = re.compile(
    r"op '([^']+)' \(kernel (\w+)(?:, layer \d+)?\) wrote (nan|-?inf) to tensor '([^']+)'"
    r"(?: \(output \d+\))? at element \d+ of \d+")


def train(plan, steps, tmp_path, extra=()):
    """Not --quiet: the progress lines are the reference numbering."""
    return run([MAPP_RUN, plan, "--data", CORPUS, "--tokenizer", "bytes", "--steps", steps,
                "--seed", 3, "--comm=local", "--threads", 1,
                "--metrics", tmp_path / "m.jsonl", *extra], check=False)


def progress_steps(stdout):
    return [int(n) for n in re.findall(r"^step (\d+)/\d+ ", stdout, re.M)]


@pytest.mark.parametrize("nan_check", [False, True])
def test_error_names_the_step_the_progress_lines_call_it(tmp_path, nan_check):
    plan = make_plan(tmp_path / "p.mplan")
    extra = ["--inject-nan", "4:gelu"] + (["--nan-check"] if nan_check else [])
    r = train(plan, 8, tmp_path, extra)
    assert r.returncode != 0, r.stderr
    assert progress_steps(r.stdout) == [1, 2, 3], r.stdout
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 3
    # The per-op check (in the step, or the re-run of the step that went
    # non-finite) names step 4, and so does the step-level message.
    assert "non-finite value: step 4, microbatch 0," in r.stderr, r.stderr
    if not nan_check:
        assert "step 4: non-finite loss or gradient" in r.stderr, r.stderr
    steps = [int(s) for s in re.findall(r"\bstep (\d+)\b", r.stderr)]
    assert steps and set(steps) == {4}, r.stderr
    m = NON_FINITE_WRITE.search(r.stderr)
    assert m and m.group(1) == "gelu" and m.group(3) == "nan", r.stderr


def test_inject_nan_step_counts_from_one(tmp_path):
    plan = make_plan(tmp_path / "p.mplan")
    r = train(plan, 2, tmp_path, ["--inject-nan", "0:gelu"])
    assert r.returncode == 2 and "--inject-nan STEP needs an integer >= 1, got '0'" in r.stderr


def test_unknown_inject_nan_op_is_refused(tmp_path):
    plan = make_plan(tmp_path / "p.mplan")
    r = train(plan, 2, tmp_path, ["--inject-nan", "1:gelx"])
    assert r.returncode == 1, r.stderr
    assert "--inject-nan: the plan has no op named 'gelx'; near: 'gelu'" in r.stderr, r.stderr
    assert progress_steps(r.stdout) == [], r.stdout
    r = train(plan, 2, tmp_path, ["--inject-nan", "1:no_such_thing_at_all"])
    assert r.returncode == 1
    assert "no op named 'no_such_thing_at_all' (ops are named as in the IR)" in r.stderr, r.stderr


def test_checkpoint_refusal_names_op_and_tensor(tmp_path):
    """lr=1e6 with AdamW: exp_avg_sq overflows while the loss is still
    finite, so the save of that state is refused: the message names the
    optimizer op that wrote the value and the state tensor, as the NaN check
    names an op and its output."""
    plan = tmp_path / "p.mplan"
    run([MAKE_PLAN, plan, *[a for a in MODEL if not a.startswith(("lr=", "max_grad"))],
         "lr=1e6", f"microbatches={GLOBAL_MB}"])
    r = train(plan, 20, tmp_path, ["--save-dir", tmp_path / "ck", "--save-every", 1,
                                   "--save-keep", 0])
    assert r.returncode != 0
    refusal = re.search(r"refusing to checkpoint step (\d+): non-finite state on rank 0: (.*)",
                        r.stderr)
    assert refusal, r.stderr
    m = NON_FINITE_WRITE.search(refusal.group(2))
    assert m, refusal.group(0)
    assert m.group(2) == "adamw", refusal.group(0)
    # The tensor is one of the state a checkpoint holds (the newest kept).
    kept = sorted(d for d in (tmp_path / "ck").iterdir() if d.name.startswith("step-")
                  and not d.name.endswith(".tmp"))
    assert kept, r.stderr
    assert m.group(4) in read_st(kept[-1] / "rank-00000.safetensors"), m.group(4)
    # The step it refuses is the last one the progress lines report.
    assert progress_steps(r.stdout)[-1] == int(refusal.group(1)), (r.stdout, refusal.group(0))


@pytest.mark.parametrize("arg,rc", [("--help", 0), ("-h", 0), ("--out", 2)])
def test_make_test_plan_takes_no_option_for_its_output(tmp_path, arg, rc):
    # `mapp-make-test-plan --help` once wrote a plan file named '--help'.
    import subprocess
    r = subprocess.run([MAKE_PLAN, arg], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == rc, r.stderr
    assert "usage: mapp-make-test-plan OUT.mplan" in r.stdout + r.stderr
    assert list(tmp_path.iterdir()) == []

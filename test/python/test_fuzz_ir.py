"""Mutation fuzzing of mapp-opt: malformed IR must give a diagnostic and a
non-zero exit (or parse, if the mutation happens to be valid) — never a
crash. Debian's MLIR has assertions off, so a verifier gap shows up here as
a signal rather than an assertion message.

Each mutation edits one token of a valid module (numbers, shapes, attribute
values, op names, operands); the pipeline then runs autodiff, the optimizer,
memory planning and plan lowering so pass code sees the damage too.
"""

import random
import re
import subprocess

import pytest

from conftest import ROOT, find_tool

SEEDS = range(int(__import__("os").environ.get("MAPP_FUZZ_SEEDS", 160)))
SOURCES = ["test/Transforms/Train/autodiff.mlir", "test/Target/Plan/to-plan.mlir"]
PIPELINE = ["-mapp-autodiff", "-mapp-optimizer", "-mapp-plan-memory",
            "-mapp-lower-to-plan"]
TOKEN = re.compile(r"\d+|[A-Za-z_][\w.]*|\S")
REPLACEMENTS = ["0", "-1", "3", "1000000000000", "x", "f32", "i32", "tensor<2x4xf32>",
                "@wte", "%0", "mapp.gelu", "mapp.linear", "{", "}", "(", ")", ":", ",",
                "\"tp\"", "1.5", "unit", ""]


def mutate(text, rng):
    tokens = list(TOKEN.finditer(text))
    m = tokens[rng.randrange(len(tokens))]
    return text[:m.start()] + rng.choice(REPLACEMENTS) + text[m.end():]


@pytest.mark.parametrize("seed", SEEDS)
def test_mutated_ir_never_crashes(seed):
    opt = find_tool("mapp-opt")
    if not opt:
        pytest.skip("mapp-opt is not built")
    rng = random.Random(seed)
    source = open(f"{ROOT}/{SOURCES[seed % len(SOURCES)]}").read()
    # Drop the lit RUN/CHECK comments: only IR matters.
    source = "\n".join(l for l in source.splitlines() if not l.startswith("//"))
    text = source
    for _ in range(1 + seed % 3):
        text = mutate(text, rng)
    r = subprocess.run([opt, "-", *PIPELINE, "-o", "/dev/null"], input=text,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), (
        f"mapp-opt died with {r.returncode} on:\n{text}\n{r.stderr[-2000:]}")
    if r.returncode == 1:
        assert "error" in r.stderr, f"failed without a diagnostic on:\n{text}"

"""The compiler's side of the kernel vocabulary (runtime/include/mapp/rt/
KernelVocab.def, docs/design.md "One kernel vocabulary").

A plan instruction's kernel is its op's name without the dialect prefix
(lib/Target/Plan/PlanBuilder.cpp), so every op of the mapp dialect is either
a row of the table or an op that never becomes an instruction (listed below
with the reason). Rows no op lowers to must say so (kRuntimeOnly). Compiled
plans (one rank, and tp=2 pp=2 dp=2 with ZeRO-1) use only table names, each
with its per-backend status. test/runtime-unit/KernelVocabTest.cpp checks
the backends' registration against the same table.
"""

import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, find_tool

DEF = os.path.join(ROOT, "runtime", "include", "mapp", "rt", "KernelVocab.def")
TD_DIR = os.path.join(ROOT, "include", "mapp", "Dialect", "Mapp", "IR")

# Ops that the plan builder never turns into an instruction.
NOT_A_KERNEL = {
    "param": "module-level declaration: a plan Value of kind Param",
    "param_ref": "reads a parameter's buffer: skipped, its Value is used",
    "grad_ref": "reads a parameter's Grad buffer: skipped likewise",
    "yield": "terminator of mapp.stage (structure, inlined into blocks)",
    "stage": "pipeline-stage region: becomes a Program's blocks",
    "subgraph": "MegaFBD subgraph: becomes a Program's blocks",
    "schedule": "task tables: become Program.tasks",
}

ROW_RE = re.compile(
    r"^MAPP_KERNEL\(\s*(\w+),\s*(-?\d+),\s*(-?\d+),\s*(-?\d+),\s*(-?\d+),"
    r"\s*([\w:]+),\s*([\w |]+?),\s*([YN]),\s*([YN]),\s*(.*?)\)\s*$",
    re.M | re.S)


def vocabulary():
    """name -> {props, cpu, cuda, why} from KernelVocab.def."""
    text = open(DEF, encoding="utf-8").read()
    rows = {}
    for m in ROW_RE.finditer(text):
        props = {p.strip() for p in m.group(7).split("|")} - {"kNoProps"}
        rows[m.group(1)] = {"props": props, "cpu": m.group(8) == "Y",
                            "cuda": m.group(9) == "Y", "why": m.group(10).strip()}
    # Every MAPP_KERNEL( line was understood (the regex is the parser).
    assert len(rows) == len(re.findall(r"^MAPP_KERNEL\(", text, re.M)) > 50
    return rows


def dialect_ops():
    ops = set()
    for name in os.listdir(TD_DIR):
        if name.endswith(".td"):
            text = open(os.path.join(TD_DIR, name), encoding="utf-8").read()
            ops |= set(re.findall(r'^def\s+Mapp_\w+Op\s*:\s*\w+<\s*"([\w.]+)"', text, re.M))
    assert len(ops) > 50
    return ops


def test_every_dialect_op_is_a_kernel_or_never_one():
    vocab, ops = vocabulary(), dialect_ops()
    missing = sorted(ops - vocab.keys() - NOT_A_KERNEL.keys())
    assert not missing, f"ops with no row in KernelVocab.def: {missing}"
    both = sorted(NOT_A_KERNEL.keys() & vocab.keys())
    assert not both, f"listed as never a kernel, yet in the table: {both}"
    stale = sorted(NOT_A_KERNEL.keys() - ops)
    assert not stale, f"NOT_A_KERNEL names no op of the dialect: {stale}"
    for name, row in vocab.items():
        runtime_only = "kRuntimeOnly" in row["props"]
        assert runtime_only == (name not in ops), (
            f"{name}: kRuntimeOnly must be set exactly when no op lowers to it")


def test_unsupported_rows_give_a_reason():
    for name, row in vocabulary().items():
        if not (row["cpu"] and row["cuda"]):
            assert row["why"] not in ('""', ""), f"{name}: N without a reason"


def compile_plan(tmp, name, pipeline):
    opt, translate = find_tool("mapp-opt"), find_tool("mapp-translate")
    if not (opt and translate):
        pytest.skip("mapp-opt / mapp-translate are not built")
    model = os.path.join(ROOT, "test", "Transforms", "Parallel", "Inputs", "gpt-4l.mlir")
    mlir, plan = tmp / f"{name}.mlir", tmp / f"{name}.mplan"
    for cmd in ([opt, model, *pipeline, "-o", mlir],
                [translate, "--mapp-to-plan", mlir, "-o", plan],
                ["flatc", "--json", "--raw-binary", "--strict-json", "-o", tmp,
                 os.path.join(ROOT, "runtime", "schema", "plan.fbs"), "--", plan]):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stderr}"
    data = json.loads((tmp / f"{name}.json").read_text())
    return {i["kernel"] for p in data["programs"] for b in p["blocks"]
            for i in b.get("instrs", [])}


@pytest.mark.parametrize("name,pipeline", [
    ("single", ["-mapp-autodiff", "-mapp-optimizer=lr=1e-3", "-mapp-plan-memory",
                "-mapp-lower-to-plan"]),
    ("parallel", ["--mapp-train-pipeline=tp=2 pp=2 dp=2 microbatches=2 zero1=true "
                  "max-grad-norm=1.0", "-mapp-plan-memory", "-mapp-lower-to-plan"]),
])
def test_compiled_plans_use_only_the_vocabulary(tmp_path, name, pipeline):
    vocab = vocabulary()
    kernels = compile_plan(tmp_path, name, pipeline)
    assert {"linear", "adamw", "grad_accumulate"} <= kernels, kernels
    if name == "parallel":
        assert {"send", "recv", "all_reduce", "param_gather"} <= kernels, kernels
    unknown = sorted(kernels - vocab.keys())
    assert not unknown, f"plan kernels outside KernelVocab.def: {unknown}"
    # What the compiler emits for a dense GPT runs on both backends.
    absent = sorted(k for k in kernels if not (vocab[k]["cpu"] and vocab[k]["cuda"]))
    assert not absent, f"emitted but missing on a backend: {absent}"

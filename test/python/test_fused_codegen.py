"""Issue 37: the CUDA source generator of mapp.fused (runtime FusedCodegen)
on every program that --mapp-fuse forms in the fusion lit tests and in the
fused models of test_fusion_models.py (GeGLU with RMS norms, squared-ReLU
with LayerNorms, QK-norm, forward and backward; the norms row programs): mapp-fused-codegen-check compiles each program's
generated source as host C++ and compares it bit for bit with the CPU
evaluator on random inputs (f32, bf16 and mixed storage), beside its own
edge cases (every op, broadcasts on every dim, reductions over any dims);
where libnvrtc is present, every generated kernel also compiles with NVRTC
for sm_90 (skipped otherwise)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, require_tool
from mapp.fused_cases import fused_cases

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_generated_kernels_match_cpu_evaluator(tmp_path):
    opt = require_tool("mapp-opt")
    check = require_tool("mapp-fused-codegen-check")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        pytest.skip("no host C++ compiler")
    cases = []
    for lit in ["fuse-blocks.mlir", "no-fuse.mlir", "fuse-norms.mlir", "fuse-softmax.mlir"]:
        src = os.path.join(ROOT, "test", "Transforms", "Fusion", lit)
        cases += fused_cases(run([opt, src, "-mapp-fuse", "-split-input-file"]).stdout)
    lit_cases = len(cases)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"), HERE]))
    for mlp, norm in [("geglu", "rms"), ("sqrelu", "layer")]:
        cfg = dict(vocab_size=256, micro_batch_size=2, seq_length=8, dim=16, n_heads=2,
                   n_layers=1, hidden=32, eps=1e-5, mlp=mlp, norm=norm)
        (tmp_path / "cfg.json").write_text(json.dumps(cfg))
        run([sys.executable, "-m", "mapp.export", "--module", "models.fused_mlp:FusedMlp",
             "--config", tmp_path / "cfg.json", "-o", tmp_path / f"{mlp}.mlir", "--no-recognize"],
            env=env)
        text = run([opt, tmp_path / f"{mlp}.mlir", "-mapp-autodiff", "-mapp-optimizer",
                    "-mapp-fuse"]).stdout
        cases += fused_cases(text)
    # The maxima model (torch.max, amax, logsumexp): its reduce_max regions
    # and their gradients' regions, as autodiff writes them.
    cfg = dict(vocab_size=256, micro_batch_size=2, seq_length=8, d_model=16, n_heads=2,
               n_layers=1, hidden=12, pieces=3)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    run([sys.executable, "-m", "mapp.export", "--module", "models.maxout_zloss:MaxoutGPT",
         "--config", tmp_path / "cfg.json", "-o", tmp_path / "maxout.mlir", "--no-recognize"],
        env=env)
    before = len(cases)
    cases += fused_cases(run([opt, tmp_path / "maxout.mlir", "-mapp-autodiff",
                              "-mapp-optimizer", "-mapp-fuse"]).stdout)
    assert any("reduce_max[" in c for c in cases[before:]), cases[before:]
    assert lit_cases >= 8 and len(cases) - lit_cases >= 16, cases
    # The models' activations are among them (test_fusion_models.py's regions).
    programs = {c.split("\t")[0] for c in cases}
    assert "gelu[tanh](%i0); mul(%0, %i1)" in programs, programs
    assert "maximum(%i0, %i1); pow[2](%0)" in programs, programs
    assert any(p.endswith(")") and "reduce_sum[" in p for p in programs), programs
    # Norms as row programs (a reduce_sum in the middle), forward and backward.
    assert sum("row " in p for p in programs) >= 8, programs
    # A softmax and a log-sum-exp (fuse-softmax.mlir): reduce_max row passes.
    assert sum(p.startswith("reduce_max[") for p in programs) >= 2, programs
    (tmp_path / "cases.tsv").write_text("\n".join(sorted(set(cases))) + "\n")
    r = run([check, "--cxx", cxx, "--work", tmp_path, "--cases", tmp_path / "cases.tsv"])
    print(r.stdout.strip())
    assert r.stdout.startswith("PASS: "), r.stdout
    # NVRTC (no GPU needed) where libnvrtc is present: exit 77 says it is not.
    r = subprocess.run([str(c) for c in [check, "--cxx", cxx, "--work", tmp_path, "--cases",
                                         tmp_path / "cases.tsv", "--nvrtc"]],
                       capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0 and r.stdout.startswith("PASS: "), r.stdout + r.stderr

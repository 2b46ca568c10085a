"""Issue 38 on the GPU machine: the tensor algebra's CUDA kernels
(runtime/src/backend/cuda/Algebra.cu) in training. Each module of
test/python/test_algebra_models.py is exported without pattern recognition
(--no-recognize: every rotary, norm and mask is algebra ops), compiled,
and trained 20 steps by mapp-run on --backend=cpu and --backend=cuda from
the same weights on the same batches; every CUDA loss must be within
--tol (default 2e-2: the CUDA backend's GEMMs and attention take bf16
operands) of the CPU loss, which test_algebra_models.py checks against
PyTorch to 1e-5.

Run from the repository root after `ninja -C build mapp-opt mapp-translate
mapp-run`:
    python3 bench/gpu/algebra_check.py [--tol 2e-2] [--keep DIR] [--backends cpu,cuda]
Prints one line per module and `algebra_check: N/N ok`; exit 1 on any
mismatch. A GPU machine without mapp-opt's LLVM (or whose torch exports
differently) runs plans exported and compiled here beforehand:
    python3 bench/gpu/algebra_check.py --keep DIR --prepare-only   (here)
    python3 bench/gpu/algebra_check.py --keep DIR --prepared       (there)
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "test" / "python"))
sys.path.insert(0, str(ROOT / "python"))
BIN = ROOT / "build" / "bin"
CORPUS = ROOT / "data" / "gpt" / "news-1k.jsonl"


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode:
        raise SystemExit(f"{cmd[0]} failed:\n{r.stderr}")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    ap.add_argument("--backends", default="cpu,cuda",
                    help="reference,tested backends (cpu,cpu checks the script without a GPU)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="export and compile every module into --keep, run nothing")
    ap.add_argument("--prepared", action="store_true",
                    help="take the plans and weights --prepare-only left in --keep")
    a = ap.parse_args()
    if (a.prepare_only or a.prepared) and not a.keep:
        ap.error("--prepare-only and --prepared need --keep DIR")
    from test_algebra_models import MODELS, SHAPE
    work = pathlib.Path(a.keep or tempfile.mkdtemp(prefix="algebra-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"),
                                                       str(ROOT / "test" / "python")]))
    ok = 0
    for name, (spec, cfg, out) in sorted(MODELS.items()):
        d = work / name
        d.mkdir(exist_ok=True)
        if a.prepared:
            if not (d / "t.mplan").is_file() or not (d / "w.safetensors").is_file():
                raise SystemExit(f"{d}: no t.mplan / w.safetensors (run --prepare-only first)")
        else:
            (d / "cfg.json").write_text(json.dumps({**SHAPE, **cfg}))
            run([sys.executable, "-m", "mapp.export", "--module", spec, "--config",
                 d / "cfg.json", "-o", d / "m.mlir", "--weights", d / "w.safetensors",
                 "--seed", 7, "--output", out, "--no-recognize"], env=env)
            run([BIN / "mapp-opt", d / "m.mlir", "-mapp-autodiff",
                 "-mapp-optimizer=lr=0.001 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1",
                 "-o", d / "t.mlir"])
            run([BIN / "mapp-translate", "--mapp-to-plan", d / "t.mlir", "-o", d / "t.mplan"])
        if a.prepare_only:
            print(f"{name}: prepared {d / 't.mplan'}")
            continue
        losses = []
        for backend in a.backends.split(","):
            run([BIN / "mapp-run", d / "t.mplan", f"--backend={backend}", "--data", CORPUS,
                 "--tokenizer", "bytes", "--steps", a.steps, "--seed", 11,
                 "--weights", d / "w.safetensors", "--metrics", d / f"{backend}.jsonl", "--quiet"])
            losses.append([json.loads(l)["loss"]
                           for l in (d / f"{backend}.jsonl").read_text().splitlines()])
        ref, got = losses
        worst = max(abs(g - c) / abs(c) for g, c in zip(got, ref))
        good = len(got) == len(ref) == a.steps and worst <= a.tol
        ok += good
        print(f"{name}: worst relative CUDA-vs-CPU loss difference over {a.steps} steps "
              f"{worst:.2e} {'ok' if good else 'FAIL'}")
    if a.prepare_only:
        return 0
    print(f"algebra_check: {ok}/{len(MODELS)} ok")
    if not a.keep:
        import shutil
        shutil.rmtree(work)
    return 0 if ok == len(MODELS) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Context parallelism on the CUDA backend against cp=1 on the same GPU
(docs/context-parallel.md, "On the GPU"): cp ranks as threads of one process
sharing the GPU (--comm=local --backend=cuda). A tiny LLaMA with
grouped-query attention (8 heads of 16, 4 key/value heads: divisible by
cp=4) and rotary, sequence 64, 20 AdamW steps from the same weights.
cp-comm=a2a runs the device path; cp-comm=ring the CPU kernel on host copies
(it says so on stderr), or with MAPP_CUDA_CP_RING=device the device ring.
Losses, gradient norms and step-0 gradients (relative to the tensor's
largest element) against cp=1, within max(TOLERANCE, FLOOR_FACTOR x the
floor): the floor is cp=1 against cp=1 started from weights one fp32
ulp away (each element times 1 ± 2^-23): how far rounding alone moves this
training run. A floor above FLOOR_LIMIT fails the check (a bar that wide
judges nothing). The CUDA
backend's GEMMs take bf16 operands in either storage (Gemm.cu), so a
one-ulp fp32 difference anywhere (a ring's merged softmax, a GEMM on a
shard's rows) flips bf16 roundings downstream: fp32 storage is not an fp32
reference, and a fixed 1e-4 bar measured that rounding (H100, 2026-12-06:
ring step-0 gradients 2e-4 to 1.2e-3, while a2a, the same kernels on the
gathered sequence, gave 2e-7). An a2a plan without its causal mask must
fail the comparison (the check can fail).

On a GPU machine that runs mapp-opt (it compiles here):
    PYTHONPATH=python python3 bench/gpu/cp_check.py [--bin DIR]
A GPU machine without mapp-opt's LLVM takes plans and weights compiled on
the development machine:
    PYTHONPATH=python /usr/bin/python3 bench/gpu/cp_check.py --prepare DIR   (here)
    PYTHONPATH=python python3 bench/gpu/cp_check.py --plans DIR [--bin DIR]  (there)
Prints one line per case and PASS / FAIL (exit status 1).
test/python/test_context_parallel_cuda.py runs the same cases under pytest."""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

STEPS = 20
CORPUS = ROOT / "data" / "gpt" / "news-1k.jsonl"
OPT = "optimizer=adamw lr=0.001 beta1=0.9 beta2=0.95 weight-decay=0.1 max-grad-norm=1.0"
MODEL = {"variant": "llama", "num_layers": 2, "hidden_size": 128,
         "num_attention_heads": 8, "num_query_groups": 4,
         "ffn_hidden_size": 256, "seq_length": 64, "vocab_size": 256,
         "micro_batch_size": 2, "tie_embeddings": False}
MICRO = 2
TOLERANCE = {"f32": 1e-4, "bf16": 2e-2}
FLOOR_FACTOR = 4
FLOOR_LIMIT = 2e-2
HOST_RING_WARNING = "runs the CPU kernel on host copies"
# layout: (pipeline options, extra environment)
LAYOUTS = {"cp2-a2a": ("cp=2 cp-comm=a2a", {}),
           "cp4-a2a": ("cp=4 cp-comm=a2a", {}),
           "cp2-ring": ("cp=2 cp-comm=ring", {}),
           "cp2-ring-device": ("cp=2 cp-comm=ring", {"MAPP_CUDA_CP_RING": "device"}),
           "cp4-ring-device": ("cp=4 cp-comm=ring", {"MAPP_CUDA_CP_RING": "device"})}


def drop_causal(ir):
    return ir.replace('{causal, comm = "a2a"', '{comm = "a2a"')


# plan name: (pipeline options, edit of the compiled IR or None)
PLANS = {"ref": (f"microbatches={MICRO}", None),
         "broken": (f"cp=2 cp-comm=a2a microbatches={MICRO}", drop_causal)}
PLANS.update({name: (f"{opts} microbatches={MICRO}", None)
              for name, (opts, _) in LAYOUTS.items()})


class CheckError(Exception):
    pass


def tool(name, bin_dir=None):
    for d in (bin_dir, os.environ.get("MAPP_BIN"), ROOT / "build" / "bin"):
        if d and (pathlib.Path(d) / name).exists():
            return pathlib.Path(d) / name
    found = shutil.which(name)
    if not found:
        raise CheckError(f"{name} is not built (MAPP_BIN or --bin)")
    return found


def cuda_library_path():
    """LD_LIBRARY_PATH with CUDA's and the pip wheels' libraries (cuDNN
    loads from there, as bench/gpu/llama.sh sets it)."""
    dirs = ["/usr/local/cuda/lib64"]
    try:
        import glob
        import nvidia
        dirs += sorted({d for p in nvidia.__path__
                        for d in glob.glob(os.path.join(p, "*", "lib"))})
    except ImportError:
        pass
    old = os.environ.get("LD_LIBRARY_PATH")
    return ":".join(dirs + ([old] if old else []))


def run(cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       timeout=600, env=env)
    if r.returncode:
        raise CheckError(f"{cmd[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def export(out):
    """The tiny LLaMA's forward graph (m.mlir) and initial weights."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cfg.json").write_text(json.dumps(MODEL))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    run([sys.executable, "-m", "mapp.export", "--module", "mapp.reference:GPT",
         "--config", out / "cfg.json", "-o", out / "m.mlir",
         "--weights", out / "w.safetensors", "--seed", "3"], env=env)
    write_ulp_weights(out)


def write_ulp_weights(out):
    """w-ulp.safetensors: w's fp32 tensors, each element times 1 +- 2^-23
    (signs from a fixed seed): the floor run's start."""
    import torch
    from mapp.safetensors import load, save
    tensors, meta = load(out / "w.safetensors")
    gen = torch.Generator().manual_seed(5)
    moved = {}
    for name, t in tensors.items():
        if t.dtype == torch.float32:
            sign = torch.randint(0, 2, t.shape, generator=gen) * 2 - 1
            t = t * (1 + sign.float() * 2.0 ** -23)
        moved[name] = t
    save(moved, out / "w-ulp.safetensors", meta)


def compile_plan(out, name, bin_dir=None):
    options, edit = PLANS[name]
    out = pathlib.Path(out)
    run([tool("mapp-opt", bin_dir), out / "m.mlir",
         f"--mapp-train-pipeline={options} {OPT}", "-o", out / f"{name}.mlir"])
    if edit:
        text = (out / f"{name}.mlir").read_text()
        edited = edit(text)
        if edited == text:
            raise CheckError(f"{name}: the edit did not apply")
        (out / f"{name}.mlir").write_text(edited)
    run([tool("mapp-translate", bin_dir), "--mapp-to-plan", out / f"{name}.mlir",
         "-o", out / f"{name}.mplan"])
    return out / f"{name}.mplan"


def prepare(out, bin_dir=None):
    """Weights and every plan in out (for --plans out elsewhere)."""
    export(out)
    return [compile_plan(out, name, bin_dir) for name in PLANS]


class Runner:
    """Trains the cases from plans in `plans` (compiled there on first use
    when `compile` is set) and caches the cp=1 runs per storage."""

    def __init__(self, work, plans=None, bin_dir=None):
        self.work = pathlib.Path(work)
        self.bin_dir = bin_dir
        self.compile = plans is None
        self.plans = self.work if plans is None else pathlib.Path(plans)
        if self.compile:
            export(self.work)
        self.refs = {}
        self.floors = {}

    def plan(self, name):
        path = self.plans / f"{name}.mplan"
        if self.compile and not path.exists():
            compile_plan(self.work, name, self.bin_dir)
        if not path.exists():
            raise CheckError(f"{path}: not prepared (--prepare DIR writes it)")
        return path

    def train(self, name, storage, extra_env=None, weights="w"):
        from mapp.safetensors import load
        out = self.work / f"{name}-{weights}-{storage}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        env = dict(os.environ, MAPP_CUDA_STORAGE=storage,
                   LD_LIBRARY_PATH=cuda_library_path(), **(extra_env or {}))
        r = run([tool("mapp-run", self.bin_dir), self.plan(name), "--backend=cuda",
                 "--comm=local", "--data", CORPUS, "--tokenizer", "bytes",
                 "--steps", STEPS, "--seed", 11,
                 "--weights", self.plans / f"{weights}.safetensors",
                 "--metrics", out / "m.jsonl", "--save-grads", out / "g.safetensors",
                 "--quiet"], env=env)
        metrics = [json.loads(l) for l in (out / "m.jsonl").read_text().splitlines()]
        grads = {k: v.double() for k, v in load(out / "g.safetensors")[0].items()}
        return metrics, grads, r.stderr

    def reference(self, storage):
        if storage not in self.refs:
            self.refs[storage] = self.train("ref", storage)
        return self.refs[storage]

    def tolerance(self, storage):
        """(bar, floor): the bar a cp layout must meet in this storage."""
        if storage not in self.floors:
            if not (self.plans / "w-ulp.safetensors").exists():
                raise CheckError("no w-ulp.safetensors (prepare again)")
            self.floors[storage] = max(worst_diff(
                self.train("ref", storage, weights="w-ulp"), self.reference(storage)))
        floor = self.floors[storage]
        if floor > FLOOR_LIMIT:
            raise CheckError(f"{storage} floor {floor:.2g} above {FLOOR_LIMIT:g}: "
                             "rounding alone moves this run too far to judge cp")
        return max(TOLERANCE[storage], FLOOR_FACTOR * floor), floor


def worst_diff(got, ref):
    """(loss, grad norm, step-0 gradient) worst relative differences."""
    (m, g, _), (rm, rg, _) = got, ref
    if len(m) != STEPS or len(rm) != STEPS:
        raise CheckError(f"{len(m)} and {len(rm)} steps, expected {STEPS}")
    loss = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(m, rm))
    norm = max(abs(a["grad_norm"] - b["grad_norm"]) / abs(b["grad_norm"])
               for a, b in zip(m, rm))
    if g.keys() != rg.keys():
        raise CheckError(f"gradients of {sorted(g)} against {sorted(rg)}")
    grad = 0.0
    for name, ref in rg.items():
        if g[name].shape != ref.shape:
            raise CheckError(f"{name}: shape {tuple(g[name].shape)} against {tuple(ref.shape)}")
        scale = max(ref.abs().max().item(), 1e-12)
        grad = max(grad, (g[name] - ref).abs().max().item() / scale)
    return loss, norm, grad


def check_layout(runner, layout, storage):
    """(ok, message) of one cp layout against cp=1."""
    ref = runner.reference(storage)
    got = runner.train(layout, storage, LAYOUTS[layout][1])
    loss, norm, grad = worst_diff(got, ref)
    tol, floor = runner.tolerance(storage)
    warned = HOST_RING_WARNING in got[2]
    ok = (max(loss, norm, grad) <= tol and ref[0][-1]["loss"] < ref[0][0]["loss"]
          and warned == (layout == "cp2-ring"))
    return ok, (f"cuda {storage} {layout}: worst relative loss {loss:.2e}, grad norm "
                f"{norm:.2e}, step-0 gradient {grad:.2e} (bar {tol:.2g}, floor {floor:.2g}); "
                f"host-ring warning {'printed' if warned else 'absent'}")


def check_broken(runner):
    """The comparison notices an a2a attention without its causal mask."""
    loss, norm, grad = worst_diff(runner.train("broken", "f32"), runner.reference("f32"))
    worst = max(loss, norm, grad)
    tol, _ = runner.tolerance("f32")
    return worst > tol, f"cuda f32 broken (no causal mask): worst {worst:.2e} (must exceed the f32 bar {tol:.2g})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", metavar="DIR", help="write weights and plans to DIR, run nothing")
    ap.add_argument("--plans", metavar="DIR", help="take weights and plans from DIR")
    ap.add_argument("--bin", metavar="DIR", help="mapp-run (and mapp-opt) from DIR")
    ap.add_argument("--work", default="/tmp/mapp-cp-check", help="run folder")
    a = ap.parse_args()
    if a.prepare:
        for p in prepare(a.prepare, a.bin):
            print(p)
        return 0
    runner = Runner(a.work, a.plans, a.bin)
    failed = 0
    for storage in sorted(TOLERANCE):
        for layout in LAYOUTS:
            try:
                ok, msg = check_layout(runner, layout, storage)
            except CheckError as e:
                ok, msg = False, f"cuda {storage} {layout}: {e}"
            print(("ok   " if ok else "FAIL ") + msg, flush=True)
            failed += not ok
    try:
        ok, msg = check_broken(runner)
    except CheckError as e:
        ok, msg = False, f"broken: {e}"
    print(("ok   " if ok else "FAIL ") + msg)
    failed += not ok
    print("PASS" if not failed else f"FAIL ({failed})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

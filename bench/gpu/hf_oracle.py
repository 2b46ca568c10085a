"""Hugging Face's own modeling code as the oracle of the model families
mapp imports from their config.json (issue 38; docs/models.md, "Model
families"). Needs transformers (5.x) and torch; no network: each model is
built from its config with random weights.

Usage (from the repository root, on the GPU machine):

    PYTHONPATH=python python3 bench/gpu/hf_oracle.py --bin build/bin \\
        [--backend cpu|cuda] [--families qwen2,mixtral,...] [--steps 4] \\
        [--tol 1e-4] [--keep DIR] [--plans DIR]

A machine without mapp-opt's LLVM (the GPU machine runs only mapp-run) takes
plans compiled beforehand on the development machine:

    PYTHONPATH=python python3 bench/gpu/hf_oracle.py --compile-plans DIR
    (then, there) ... hf_oracle.py --plans DIR ...

For each family (the small configs of test/python/hf_families_ref.py: the
keys of the published config.json, tiny sizes) it

  1. builds transformers' AutoModelForCausalLM from the config (eager
     attention, fp32), re-draws every weight (std 0.2; norm gains around
     their identity) and save_pretrained()s it: HF-named safetensors;
  2. converts the file to mapp's names (python/mapp/hf_families.py) and back,
     and checks both round trips are bit-identical (mapp -> HF -> mapp too);
  3. imports the same config.json with mapp-translate --import-gpt-config,
     compiles it (mapp-opt -mapp-autodiff -mapp-optimizer=AdamW) and runs
     `--steps` steps of mapp-run --backend=BACKEND from the converted weights,
     recording its losses and batches;
  4. trains the HF model on the same batches with torch.optim.AdamW (same
     hyperparameters), the loss being mean cross-entropy of HF's logits
     against mapp's targets; every step's loss must agree within --tol
     (relative);
  5. compares the logits at the last position of a prompt: mapp-run
     --generate --no-kv-cache --greedy --max-new-tokens 1 --generate-out
     against HF's forward on the same prompt tokens (max abs difference
     within --tol times max(1, max |logit|)).

Prints one line per family, `PASS family ...` or `FAIL family: reason`, and
exits non-zero when any family fails.
"""
import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "test" / "python"))
from hf_families_ref import SMALL  # noqa: E402
from mapp import hf_families, safetensors  # noqa: E402

CORPUS = ROOT / "data" / "gpt" / "news-1k.jsonl"
T, B = 16, 2
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-8, 0.1
OPT = f"lr={LR} beta1={BETAS[0]} beta2={BETAS[1]} eps={EPS} weight-decay={WD}"
PROMPT = "The quick brown"  # bytes tokenizer: one token per byte
# Keys of the published files that are metadata for transformers' config.
META = ("architectures", "transformers_version", "torch_dtype", "_name_or_path", "auto_map")


def sh(cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace")
    if r.returncode:
        raise RuntimeError(f"{pathlib.Path(str(cmd[0])).name} failed: {r.stderr.strip()[-800:]}")
    return r


def hf_model(cfg, seed):
    from transformers import AutoConfig, AutoModelForCausalLM
    kwargs = {k: v for k, v in cfg.items() if k not in META and k != "model_type"}
    # The small configs keep the published special-token ids; one past the
    # tiny vocabulary would be an out-of-range padding_idx for HF's embedding.
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(kwargs.get(key), int) and kwargs[key] >= cfg["vocab_size"]:
            kwargs[key] = None
    config = AutoConfig.for_model(cfg["model_type"], **kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.float()
    gemma = cfg["model_type"] in ("gemma", "gemma2")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g) * 0.2
            identity = ("norm" in name and name.endswith(".weight") and p.dim() == 1
                        and not gemma)
            p.copy_(r + 1.0 if identity else r)
    model.train()  # dropout is 0 in every config; train() as mapp-run trains
    return model


def load_saved(d):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        out.update(load_file(f))
    return out


def check_round_trip(hf_sd, cfg):
    mapp = hf_families.hf_to_mapp(hf_sd, cfg)
    back = hf_families.mapp_to_hf(mapp, cfg)
    if back.keys() != hf_sd.keys():
        raise RuntimeError(f"HF -> mapp -> HF names differ: {sorted(set(back) ^ set(hf_sd))[:5]}")
    for k in hf_sd:
        if not torch.equal(back[k], hf_sd[k]):
            raise RuntimeError(f"HF -> mapp -> HF changed '{k}'")
    again = hf_families.hf_to_mapp(back, cfg)
    for k in mapp:
        if not torch.equal(again[k], mapp[k]):
            raise RuntimeError(f"mapp -> HF -> mapp changed '{k}'")
    return mapp


def compile_plan(b, d):
    """config.json in d -> d/train.mplan (mapp-translate, mapp-opt)."""
    sh([b / "mapp-translate", "--import-gpt-config", d / "config.json", "--seq-length", T,
        "--micro-batch-size", B, "-o", d / "model.mlir"])
    sh([b / "mapp-opt", d / "model.mlir", "-mapp-autodiff", f"-mapp-optimizer={OPT}",
        "-o", d / "train.mlir"])
    sh([b / "mapp-translate", "--mapp-to-plan", d / "train.mlir", "-o", d / "train.mplan"])


def run_family(family, a, tmp):
    cfg = SMALL[family]
    tmp = pathlib.Path(tmp)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    model = hf_model(cfg, seed=5)
    try:
        model.save_pretrained(tmp / "hf", safe_serialization=True)
    except TypeError:  # a transformers that always writes safetensors
        model.save_pretrained(tmp / "hf")
    hf_sd = load_saved(tmp / "hf")
    mapp = check_round_trip(hf_sd, cfg)
    safetensors.save(mapp, tmp / "mapp.safetensors")

    b = pathlib.Path(a.bin)
    if a.plans:
        plan = pathlib.Path(a.plans) / family / "train.mplan"
        if not plan.is_file():
            raise RuntimeError(f"no compiled plan {plan} (--compile-plans writes it)")
        (tmp / "train.mplan").write_bytes(plan.read_bytes())
    else:
        compile_plan(b, tmp)

    # Logits at the prompt's last position, before any training.
    sh([b / "mapp-run", tmp / "train.mplan", f"--backend={a.backend}", "--tokenizer", "bytes",
        "--weights", tmp / "mapp.safetensors", "--generate", "--no-kv-cache", "--greedy",
        "--max-new-tokens", 1, "--prompt", PROMPT, "--generate-out", tmp / "gen.jsonl"])
    gen = json.loads((tmp / "gen.jsonl").read_text().splitlines()[0])
    mapp_logits = torch.tensor(gen["logits"], dtype=torch.float32)
    ids = torch.tensor([list(PROMPT.encode())])
    with torch.no_grad():
        hf_logits = model(input_ids=ids).logits[0, -1].float()
    n = min(len(mapp_logits), len(hf_logits))
    logit_err = (mapp_logits[:n] - hf_logits[:n]).abs().max().item()
    logit_tol = a.tol * max(1.0, hf_logits.abs().max().item())

    sh([b / "mapp-run", tmp / "train.mplan", f"--backend={a.backend}", "--data", CORPUS,
        "--tokenizer", "bytes", "--steps", a.steps, "--seed", 11, "--quiet",
        "--weights", tmp / "mapp.safetensors", "--metrics", tmp / "m.jsonl",
        "--dump-batches", tmp / "b.jsonl"])
    losses = [json.loads(l)["loss"] for l in (tmp / "m.jsonl").read_text().splitlines()]
    batches = [json.loads(l) for l in (tmp / "b.jsonl").read_text().splitlines()]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    worst = 0.0
    for step, batch in enumerate(batches):
        opt.zero_grad()
        logits = model(input_ids=torch.tensor(batch["tokens"])).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               torch.tensor(batch["targets"]).reshape(-1))
        loss.backward()
        opt.step()
        rel = abs(losses[step] - loss.item()) / loss.item()
        worst = max(worst, rel)
        if rel > a.tol:
            raise RuntimeError(f"step {step}: mapp loss {losses[step]:.7f}, "
                               f"HF {loss.item():.7f} (relative {rel:.2e})")
    if logit_err > logit_tol:
        raise RuntimeError(f"last-position logits differ by {logit_err:.2e} "
                           f"(tolerance {logit_tol:.2e})")
    return (f"{len(batches)} steps, worst loss rel diff {worst:.2e}, "
            f"logits max abs diff {logit_err:.2e}, names round-trip bit-identical")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--families", default=",".join(sorted(SMALL)))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--keep", help="keep each family's files under this directory")
    ap.add_argument("--plans", help="take each family's train.mplan from DIR/<family>/")
    ap.add_argument("--compile-plans", metavar="DIR",
                    help="only compile each family's plan into DIR/<family>/ and exit")
    a = ap.parse_args()
    if a.compile_plans:
        for family in a.families.split(","):
            d = pathlib.Path(a.compile_plans) / family
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(SMALL[family], indent=1))
            compile_plan(pathlib.Path(a.bin), d)
            print(f"compiled {d / 'train.mplan'}")
        return 0
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"backend {a.backend}")
    failed = 0
    for family in a.families.split(","):
        if family not in SMALL:
            print(f"FAIL {family}: unknown family (have {', '.join(sorted(SMALL))})")
            failed += 1
            continue
        try:
            if a.keep:
                d = pathlib.Path(a.keep) / family
                d.mkdir(parents=True, exist_ok=True)
                print(f"PASS {family}: {run_family(family, a, d)}")
            else:
                with tempfile.TemporaryDirectory() as d:
                    print(f"PASS {family}: {run_family(family, a, d)}")
        except Exception as e:  # one line per family, whatever went wrong
            print(f"FAIL {family}: {type(e).__name__}: {e}")
            failed += 1
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

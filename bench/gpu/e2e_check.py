"""Loss curves of mapp-run --backend=cuda against PyTorch (bf16 autocast).

Usage: e2e_check.py CFG.json INIT.safetensors METRICS.jsonl[,NAME=METRICS.jsonl...] BATCHES.jsonl
       [--lr 1e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --wd 0.1 --tol 2e-2]
       [--no-fp32] [--early 10]
       e2e_check.py init CFG.json OUT.safetensors   (GPT(cfg, seed=7) weights,
       what `mapp.export --seed 7` writes)

Trains mapp.reference.GPT (the numerical oracle, python/mapp/reference.py)
on the GPU from the same initial weights on the exact batches mapp-run used
(--dump-batches), with torch.optim.AdamW, once under bf16 autocast and once
in fp32. Passes when every step's loss of the mapp run is within `tol`
(relative) of the autocast run. Prints one summary line (one per metrics
file: several runs of the same batches, e.g. a plan fused and unfused,
against one PyTorch run; NAME= labels a run).

--no-fp32 skips the fp32 run (at a billion parameters it costs more than
the rest). An MoE config (num_moe_experts) is held step by step over the
first --early steps and by the mean of the last 10 after them: past the
first steps a few routing choices flip between any two precisions and the
curves part by ~2% (docs/moe.md, bench/gpu/moe_check.py); its PyTorch side
is bench/gpu/torch_moe.py's model (mapp.reference's MoE ops run on the CPU
only).

The training recipe: the flags above, overridden by the config's
"_curve_train" object (lr, clip, warmup, total_steps, min_lr), which
prepare_fusion.sh writes beside the mapp plan's optimizer options from the
same values: gradient clipping as clip_grad_norm_, and mapp's cosine
schedule (linear warmup, cosine decay to min_lr) where warmup or
total_steps is given. --losses-out FILE keeps PyTorch's curves (JSON).
"""
import argparse
import json
import math
import sys

import torch

from mapp import safetensors
from mapp.reference import GPT
from moe_check import fast_model, rel as rel_diffs, tracks  # the MoE check's rules and model

DEVICE = "cuda"  # a CPU run of this script (its test) sets "cpu"


def scheduled_lr(a, k):
    """mapp's scheduledLr (runtime/src/plan/KernelSpecs.cpp) at step k."""
    if not (a.warmup or a.total_steps):
        return a.lr
    if k < a.warmup:
        return a.lr * (k + 1) / a.warmup
    if k >= a.total_steps:
        return a.min_lr
    t = (k - a.warmup) / (a.total_steps - a.warmup)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))


def build(cfg, init):
    """The PyTorch model of the curve: mapp.reference.GPT, or for an MoE
    config torch_moe's on the GPU (moe_check.fast_model)."""
    if cfg.get("num_moe_experts"):
        return fast_model(cfg, init)
    torch.manual_seed(0)
    model = GPT(cfg).to(DEVICE)
    model.load_state_dict({k: v.to(DEVICE) for k, v in init.items()})
    return model


def train(cfg, init, batches, args, autocast):
    model = build(cfg, init)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr,
                            betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.wd)
    losses = []
    for k, b in enumerate(batches):
        tok = torch.tensor(b["tokens"], dtype=torch.long, device=DEVICE)
        tgt = torch.tensor(b["targets"], dtype=torch.long, device=DEVICE)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            loss = model(tok, tgt)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for g in opt.param_groups:
            g["lr"] = scheduled_lr(args, k)
        opt.step()
        losses.append(loss.item())
    return losses


def report(label, mapp, bf, fp, fp_note, cfg, args):
    rel = rel_diffs(mapp, bf)
    if fp is not None:
        fp_note = f"vs torch fp32 {max(rel_diffs(mapp, fp)):.2e}; " + fp_note
    if cfg.get("num_moe_experts", 0) and len(mapp) > args.early + 10:
        first, tail, _ = tracks(mapp, bf, args.tol, args.early)
        how = (f"first {args.early} steps {first:.2e} (step {rel.index(first)}), "
               f"last-10 mean {tail:.2e}, any step {max(rel):.2e}")
        worst = max(first, tail)
    else:
        worst = max(rel)
        how = f"{worst:.2e} (step {rel.index(worst)})"
    ok = worst <= args.tol and mapp[-1] < mapp[0]
    print(f"e2e {label}: {len(mapp)} steps, loss {mapp[0]:.4f} -> {mapp[-1]:.4f} "
          f"(torch bf16 {bf[0]:.4f} -> {bf[-1]:.4f}); max rel diff vs torch bf16 "
          f"{how}; {fp_note} -> {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "init":
        cfg = json.load(open(sys.argv[2]))
        model = GPT(cfg, seed=7)
        safetensors.save({k: v.detach().contiguous() for k, v in
                          model.state_dict().items()}, sys.argv[3])
        return
    p = argparse.ArgumentParser()
    p.add_argument("cfg")
    p.add_argument("init")
    p.add_argument("metrics")
    p.add_argument("batches")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--tol", type=float, default=2e-2)
    p.add_argument("--name", default="")
    p.add_argument("--no-fp32", action="store_true")
    p.add_argument("--early", type=int, default=10)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--total-steps", type=int, default=0)
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--losses-out", default="")
    args = p.parse_args()
    cfg = json.load(open(args.cfg))
    for key, value in cfg.get("_curve_train", {}).items():
        setattr(args, key, value)
    init = safetensors.load(args.init)[0]
    runs = []
    for item in args.metrics.split(","):
        label, _, path = item.rpartition("=")
        runs.append((label or args.name, [json.loads(l) for l in open(path)]))
    batches = [json.loads(l) for l in open(args.batches)]
    for _, metrics in runs:
        assert len(metrics) == len(batches), (len(metrics), len(batches))
    bf = train(cfg, init, batches, args, True)
    fp = None if args.no_fp32 else train(cfg, init, batches, args, False)
    if args.losses_out:
        json.dump({"torch_bf16": bf, "torch_fp32": fp}, open(args.losses_out, "w"))
    fp_note = "fp32 run skipped"
    if fp is not None:
        fp_note = f"torch bf16 vs fp32 {max(rel_diffs(bf, fp)):.2e}"
    ok = True
    for label, metrics in runs:
        ok &= report(label, [m["loss"] for m in metrics], bf, fp, fp_note, cfg, args)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

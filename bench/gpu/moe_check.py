"""End-to-end check of the CUDA MoE kernels: an MoE GPT trained by mapp-run
--backend=cuda, by mapp-run's CPU backend and by PyTorch from the same
initial weights on the same batches (mapp-run --dump-batches).

Usage:
  moe_check.py init CFG.json OUT.safetensors     GPT(cfg, seed=7)'s weights
  moe_check.py check CFG.json INIT.safetensors CUDA.jsonl CPU.jsonl BATCHES.jsonl
      [--name N] [--tol 2e-2] [--early 10] [--cpu-tol 1e-4] [--same SYNC.jsonl]

PyTorch curves:
  fp32  mapp.reference.GPT (the numerical oracle: python/mapp/moe.py's ops,
        plain formulas, CPU only) in fp32 on the CPU;
  bf16  bench/gpu/torch_moe.py's fast model (the benchmark's PyTorch side,
        same parameter names) under bf16 autocast on the GPU — dropless
        configs only.
Passes when the CUDA run tracks the fp32 reference and the bf16 model
within `tol` (relative; the dense e2e check's 2e-2 against torch bf16): step
by step over the first `early` steps, and as the mean of the last 10 steps.
Past the first steps a few routing choices flip between any two precisions
and the curves part by ~2% (docs/moe.md), so later steps are held to the
curve's level, not step by step. The CPU run (the plan with fp32
activations) is within `cpu-tol` of the fp32 reference over the first
`early` steps (fp32 against fp32: routing flips there too, later) and
within `tol` on the last-10 mean, the loss falls, and (--same) a second CUDA run's losses
(MAPP_CUDA_MOE_COUNTS=sync, its first steps) are within `tol` of the first's
(identical when the dense kernels are deterministic). Prints one summary
line last.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mapp import safetensors  # noqa: E402
from mapp.reference import GPT  # noqa: E402


def adamw(params, a):
    return torch.optim.AdamW(params, lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                             weight_decay=a.wd)


def train_reference(cfg, init, batches, a):
    torch.manual_seed(0)
    model = GPT(cfg)
    model.load_state_dict(init)
    opt = adamw(model.parameters(), a)
    losses = []
    for b in batches:
        tok = torch.tensor(b["tokens"], dtype=torch.long)
        tgt = torch.tensor(b["targets"], dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        loss = model(tok, tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def fast_model(cfg, init):
    """torch_moe.GPT on the GPU with the initial weights (the reference's
    parameter names)."""
    import torch_moe
    torch_moe.probe_grouped_mm()
    torch.manual_seed(0)
    model = torch_moe.GPT(cfg).cuda()
    missing, unexpected = model.load_state_dict({k: v.cuda() for k, v in init.items()},
                                                strict=False)
    if missing or unexpected:
        raise SystemExit(f"torch_moe.GPT names differ: missing {missing}, unexpected {unexpected}")
    return model


def train_fast(cfg, init, batches, a):
    import torch_moe
    model = fast_model(cfg, init)
    opt = adamw(model.parameters(), a)
    losses = []
    for b in batches:
        tok = torch.tensor(b["tokens"], dtype=torch.long, device="cuda")
        tgt = torch.tensor(b["targets"], dtype=torch.long, device="cuda")
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tok, tgt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, torch_moe.GROUPED


def rel(xs, ys):
    return [abs(x - y) / abs(y) for x, y in zip(xs, ys)]


def tracks(xs, ref, tol, early, tail_tol=None):
    """(worst early step, last-10 mean difference, within the bars): step by
    step (tol) while routing agrees, the curve's level (tail_tol, default
    tol) after."""
    e = max(rel(xs[:early], ref[:early]))
    n = min(10, len(xs))
    tail = abs(sum(xs[-n:]) - sum(ref[-n:])) / abs(sum(ref[-n:]))
    return e, tail, e <= tol and tail <= (tol if tail_tol is None else tail_tol)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "init":
        cfg = json.load(open(sys.argv[2]))
        model = GPT(cfg, seed=7)
        safetensors.save({k: v.detach().contiguous() for k, v in
                          model.state_dict().items()}, sys.argv[3])
        return
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["check"])
    p.add_argument("cfg")
    p.add_argument("init")
    p.add_argument("cuda")
    p.add_argument("cpu")
    p.add_argument("batches")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--tol", type=float, default=2e-2)
    p.add_argument("--early", type=int, default=10)
    p.add_argument("--cpu-tol", type=float, default=1e-4)
    p.add_argument("--same", default="")
    p.add_argument("--name", default="")
    a = p.parse_args()
    cfg = json.load(open(a.cfg))
    init = safetensors.load(a.init)[0]
    cuda = [json.loads(l) for l in open(a.cuda)]
    cpu = [json.loads(l) for l in open(a.cpu)]
    batches = [json.loads(l) for l in open(a.batches)]
    assert len(cuda) == len(batches) == len(cpu), (len(cuda), len(cpu), len(batches))
    mc = [m["loss"] for m in cuda]
    mcpu = [m["loss"] for m in cpu]
    fp = train_reference(cfg, init, batches, a)
    notes, ok = [], True
    e, tail, good = tracks(mc, fp, a.tol, a.early)
    ok &= good
    notes.append(f"cuda vs torch fp32 {e:.2e} (first {a.early} steps), last-10 mean "
                 f"{tail:.2e}, any step {max(rel(mc, fp)):.2e}")
    # fp32 against fp32: equal to ~1e-7 until a routing choice flips on a
    # summation-order difference (step ~8 of gpt-moe-e2e on CPU, then the
    # curves part by up to 2.6e-2 at step 57, measured 2026-12-03).
    e, tail, good = tracks(mcpu, fp, a.cpu_tol, a.early, a.tol)
    ok &= good
    notes.append(f"cpu vs torch fp32 {e:.2e} (first {a.early} steps), last-10 mean "
                 f"{tail:.2e}")
    if cfg.get("moe_capacity_factor") is None and not torch.cuda.is_available():
        notes.append("no GPU: torch bf16 curve skipped")
    elif cfg.get("moe_capacity_factor") is None:
        bf, grouped = train_fast(cfg, init, batches, a)
        e, tail, good = tracks(mc, bf, a.tol, a.early)
        ok &= good
        notes.append(f"cuda vs torch bf16 ({grouped}) {e:.2e} (first {a.early} steps), "
                     f"last-10 mean {tail:.2e}; torch bf16 vs fp32 any step "
                     f"{max(rel(bf, fp)):.2e}")
    # Routing: expert rows of step 0 (same weights, same batch) on both backends.
    t0c, t0p = cuda[0].get("expert_tokens", {}), cpu[0].get("expert_tokens", {})
    if t0c:
        same = sum(t0c[k] == t0p.get(k) for k in t0c)
        dev = max(abs(x - y) for k in t0c for x, y in zip(t0c[k], t0p.get(k, t0c[k])))
        notes.append(f"step-0 expert rows equal in {same}/{len(t0c)} layers (max diff {dev})")
    if a.same:
        sync = [json.loads(l)["loss"] for l in open(a.same)]
        n = min(len(sync), len(mc))
        rs = rel(sync[:n], mc[:n])
        ok &= max(rs) <= a.tol
        notes.append(f"MAPP_CUDA_MOE_COUNTS=sync vs async over {n} steps: "
                     + ("identical" if sync[:n] == mc[:n] else f"{max(rs):.2e}"))
    ok &= mc[-1] < mc[0]
    print(f"moe e2e {a.name}: {len(mc)} steps, loss {mc[0]:.4f} -> {mc[-1]:.4f} (torch fp32 "
          f"{fp[0]:.4f} -> {fp[-1]:.4f}); max rel diff: " + "; ".join(notes) +
          f" -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

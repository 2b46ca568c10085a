"""PyTorch side of the MoE benchmark (bench/gpu/moe.sh): the MoE GPT of
python/mapp/moe.py (pre-norm GPT-2 blocks, tanh GELU, tied embeddings,
learned positions; every MLP a token-choice top-k MoE of GELU experts
without biases, router logits in fp32, softmax over the top-k, dropless,
Switch load-balancing and z-losses added to the loss) written for speed:
bf16 autocast, SDPA (flash) attention, fused AdamW, tokens sorted by expert
(one stable argsort) and the expert GEMMs as torch._grouped_mm on device
offsets (no host sync) where this torch has it with a backward, else one
matmul per expert (one host read of the counts per layer); the bf16 weight
layout handed to it ([E,K,N] or column-major) timed on the real shapes at
start-up and the faster kept. eager or torch.compile.

Parameter names are the reference module's (mapp.reference.GPT), so
moe_check.py loads the e2e check's initial weights into it and trains it
on mapp-run's batches as the bf16 PyTorch curve.

Usage: torch_moe.py CFG.json --mode eager|compile --steps N --warmup W
Prints one JSON line: impl, ms_per_step (median), tokens_per_s, peak_gib,
grouped (grouped_mm or loop).
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_train import arguments, time_training

GROUPED = None  # "grouped_mm" or "loop", decided once by probe_grouped_mm()
# Layout of the bf16 expert weights handed to the GEMMs: "kn" ([E, K, N]
# row-major, the parameters' layout) or "nk" (column-major, the layout
# torchtitan's GroupedExperts passes to _grouped_mm); pick_layout() times both.
LAYOUT = "kn"
GEMM_DTYPE = torch.bfloat16  # the expert GEMMs' operands (float32: a CPU check)


def probe_grouped_mm():
    """torch._grouped_mm with 2-d x 3-d operands, offsets and a backward that
    matches per-expert matmuls; else the loop."""
    global GROUPED
    if GROUPED is not None:
        return GROUPED
    GROUPED = "loop"
    if not hasattr(torch, "_grouped_mm") or not torch.cuda.is_available():
        return GROUPED
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(48, 32, device="cuda", generator=g).bfloat16().requires_grad_()
        w = torch.randn(3, 32, 16, device="cuda", generator=g).bfloat16().requires_grad_()
        offs = torch.tensor([16, 16, 48], device="cuda", dtype=torch.int32)
        y = torch._grouped_mm(x, w, offs=offs)
        ref = torch.cat([x[:16] @ w[0], x[16:16] @ w[1], x[16:] @ w[2]])
        y.float().sum().backward()
        gx, gw = x.grad.clone(), w.grad.clone()
        x.grad = w.grad = None
        ref.float().sum().backward()
        ok = (torch.allclose(y.float(), ref.float(), rtol=2e-2, atol=2e-2)
              and torch.allclose(gx.float(), x.grad.float(), rtol=2e-2, atol=2e-2)
              and torch.allclose(gw.float(), w.grad.float(), rtol=2e-2, atol=2e-1))
        if ok:
            GROUPED = "grouped_mm"
    except Exception:  # no kernel for this GPU/dtype, or no backward
        pass
    return GROUPED


def pick_layout(m, k, n, e, reps=5):
    """The faster bf16 weight layout for _grouped_mm on these shapes
    (forward + backward, including the cast/copy of the weights)."""
    global LAYOUT
    if GROUPED != "grouped_mm":
        return LAYOUT
    best = None
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(e, k, n, device="cuda", requires_grad=True)
    offs = torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * (m // e)
    for lay in ("kn", "nk"):
        LAYOUT = lay
        times = []
        for i in range(reps + 2):
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
            y = expert_mm(x, bf16_weight(w), offs, None)
            y.backward(torch.ones_like(y))
            t1.record()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(t0.elapsed_time(t1))
        t = sorted(times)[len(times) // 2]
        if best is None or t < best[0]:
            best = (t, lay)
    LAYOUT = best[1]
    return LAYOUT


def bf16_weight(w):
    """w [E, K, N] (fp32 master) as bf16 in LAYOUT, one cast-copy kernel."""
    if LAYOUT == "nk":
        e, k, n = w.shape
        return torch.empty(e, n, k, device=w.device, dtype=GEMM_DTYPE).copy_(
            w.transpose(1, 2)).transpose(1, 2)
    return w.to(GEMM_DTYPE)


def expert_mm(x, w, offs, counts):
    """x [R, K] sorted by expert, w [E, K, N]: expert e's rows times w[e]."""
    if GROUPED == "grouped_mm":
        return torch._grouped_mm(x, w, offs=offs)
    parts, start = [], 0
    for e, c in enumerate(counts.tolist()):
        parts.append(x[start:start + c] @ w[e])
        start += c
    return torch.cat(parts)


class Experts(nn.Module):
    def __init__(self, e, h, f):
        super().__init__()
        self.fc1 = nn.Module()
        self.fc1.weight = nn.Parameter(torch.empty(e, h, f))
        self.fc2 = nn.Module()
        self.fc2.weight = nn.Parameter(torch.empty(e, f, h))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.e, self.k = c["num_moe_experts"], c["moe_router_topk"]
        self.aux_coeff = c.get("moe_aux_loss_coeff", 0.0)
        self.z_coeff = c.get("moe_z_loss_coeff", 0.0)
        if c.get("moe_capacity_factor") is not None:
            raise SystemExit("torch_moe.py: dropless only (no moe_capacity_factor)")
        self.router = nn.Linear(h, self.e, bias=False)
        self.experts = Experts(self.e, h, c["moe_ffn_hidden_size"])

    def forward(self, x):
        b, t, h = x.shape
        n, k, e = b * t, self.k, self.e
        xf = x.reshape(n, h)
        # Router in fp32 (Megatron's moe_router_dtype=fp32; mapp computes the
        # router GEMM in bf16 with fp32 accumulation).
        logits = F.linear(xf.float(), self.router.weight.float())
        scores, experts = torch.topk(logits, k, dim=-1)
        probs = torch.softmax(scores, dim=-1)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (expert, token) order
        counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        xp = xf.to(GEMM_DTYPE)[order // k]
        w1 = bf16_weight(self.experts.fc1.weight)
        w2 = bf16_weight(self.experts.fc2.weight)
        hid = F.gelu(expert_mm(xp, w1, offs, counts), approximate="tanh")
        yp = expert_mm(hid, w2, offs, counts)
        y = torch.empty_like(yp)
        y[order] = yp  # back to (token, choice) order
        out = (y.view(n, k, h) * probs.unsqueeze(-1).to(y.dtype)).sum(1)
        losses = []
        if self.aux_coeff > 0:
            s = torch.softmax(logits, dim=-1).sum(0)
            losses.append((s * counts.float()).sum() * (e * self.aux_coeff / (n * n * k)))
        if self.z_coeff > 0:
            losses.append(torch.logsumexp(logits, dim=-1).square().mean() * self.z_coeff)
        return out.view(b, t, h), losses


class Attention(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)

    def forward(self, x):
        B, T, H = x.shape
        q, k, v = self.qkv(x).split(H, dim=2)
        q, k, v = (u.view(B, T, self.heads, H // self.heads).transpose(1, 2)
                   for u in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(B, T, H))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.ln1 = nn.LayerNorm(h)
        self.attn = Attention(h, c["num_attention_heads"])
        self.ln2 = nn.LayerNorm(h)
        self.mlp = MoE(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        y, losses = self.mlp(self.ln2(x))
        return x + y, losses


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        freq = c.get("moe_layer_freq", 1)
        if freq not in (1, [1] * c["num_layers"]):
            raise SystemExit("torch_moe.py: every layer MoE (moe_layer_freq 1)")
        self.wte = nn.Embedding(c["vocab_size"], h)
        self.wpe = nn.Embedding(c["seq_length"], h)
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_layers"]))
        self.ln_f = nn.LayerNorm(h)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0, 0.02)

    def forward(self, tok, tgt):
        x = self.wte(tok) + self.wpe.weight[: tok.shape[1]]
        aux = []
        for blk in self.layers:
            x, losses = blk(x)
            aux += losses
        logits = self.ln_f(x) @ self.wte.weight.t()
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))
        for a in aux:
            loss = loss + a
        return loss


def active_params(c):
    h, L, V, s = c["hidden_size"], c["num_layers"], c["vocab_size"], c["seq_length"]
    e, k, f = c["num_moe_experts"], c["moe_router_topk"], c["moe_ffn_hidden_size"]
    attn = 4 * h * h + 4 * h
    norms = 4 * h
    total = V * h + s * h + 2 * h + L * (attn + norms + h * e + e * 2 * h * f)
    active = V * h + s * h + 2 * h + L * (attn + norms + h * e + k * 2 * h * f)
    return active, total


def main():
    a, c = arguments(lambda p: p.add_argument("--grouped", default="auto",
                                              choices=["auto", "loop"]))
    global GROUPED
    if a.grouped == "loop":
        GROUPED = "loop"
    probe_grouped_mm()
    m = c["micro_batch_size"] * c["seq_length"] * c["moe_router_topk"]
    h, f, e = c["hidden_size"], c["moe_ffn_hidden_size"], c["num_moe_experts"]
    pick_layout(m, h, f, e)
    torch.manual_seed(0)
    row = time_training(GPT(c).cuda(), c, a)
    act, tot = active_params(c)
    row.update({"grouped": GROUPED + ("" if GROUPED == "loop" else f" {LAYOUT}"),
                "active_params": act, "total_params": tot})
    print(json.dumps(row))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench/cp: mapp-sim's prediction for Llama-3-8B at long sequences with
context parallelism (issue 40), next to torchtitan's published figures.

  bench/cp/llama8b_128k.py [--bin build/bin] [--json out.json] [--layers N]

Builds a mapp-sim config (docs/mapp-sim.md, "Context parallelism") per
layout, runs `mapp-sim --config`, and prints step time, tokens/s per GPU,
MFU, peak memory per GPU and the cp communication (total and exposed).

The model: Llama-3-8B (32 layers, hidden 4096, 32 heads, 8 kv heads of 128,
SwiGLU FFN 14336, vocabulary 128256, untied head), bf16 compute and
storage, micro-batch 1 sequence, full activation recomputation (as
torchtitan's CP runs), tp = pp = 1. The rates (no measurement of a
whole 8B step exists here):

- GEMMs at 740 TFLOP/s and streaming at 2700 GB/s: the cost model's H100
  profile (runtime/src/cost/CostModel.cpp, 75% / 80% of the data sheet),
  the rates --mapp-auto-parallel prices layouts with; peak 989 TFLOP/s.
- The attention core at mapp's measured H100 cuDNN rate: the l3-8b-16k row
  of docs/benchmarks.md ("The attention table", 2026-12-05: B 1, 32/8 heads
  of 128, T 16384, causal: 3.493 ms forward, 14.597 ms forward+backward),
  i.e. 630 TFLOP/s forward over the causal pairs and a backward 3.18x the
  forward's time; a ring block runs at that rate.
- Links: NVLink 450 GB/s per direction (3600 Gb/s, 2 us) inside a node,
  400 Gb/s (5 us) between nodes, one NIC per GPU.

Layouts (mapp's: cp lives inside dp; the cp group is 8 consecutive dp ranks,
one node; the gradient is reduced over all dp ranks with ZeRO-1's
reduce-scatter + all-gather, fp32 gradients, after the backward, not
overlapped; one 64-GPU row with Megatron's overlap_grad_reduce, which mapp
does not have, shows what it would hide):
- 8 GPUs: cp 8, sequence 131,072 (and 262,144, torchtitan's CP 8 row), and
  cp 4 x dp 2 at 131,072 (torchtitan's CP 4 row);
- 64 GPUs: 8 nodes, cp 8 inside a node x dp 8, sequence 131,072.
Both ring (p2p) and all-to-all (Ulysses) cp at 131,072 on 8 GPUs.

Memory per GPU: ZeRO-1 over all N data-parallel ranks (mapp's: fp32
parameter and gradient, bf16 copy, AdamW moments / N: 10 + 8/N bytes a
parameter) plus what full recomputation keeps (each layer's input over
S/cp tokens, bf16), one layer's recomputed activations and the fp32 logits
and their gradient over S/cp tokens. The row "FSDP" is the same with
everything sharded over N (18/N bytes a parameter: torchtitan's FSDP2,
which mapp does not have), for the comparison only.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

L, H, HEADS, KV, HD, FFN, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
E = 2  # bf16 bytes
GEMM_TFLOPS, MEM_GBPS, PEAK_TFLOPS = 740.0, 2700.0, 989.0
# mapp's cuDNN attention on the H100, l3-8b-16k (docs/benchmarks.md).
ATTN_T, ATTN_FWD_MS, ATTN_FWDBWD_MS = 16384, 3.493, 14.597
ATTN_TFLOPS = 4 * HEADS * HD * ATTN_T * (ATTN_T + 1) / 2 / (ATTN_FWD_MS * 1e-3) / 1e12
ATTN_BWD_FACTOR = (ATTN_FWDBWD_MS - ATTN_FWD_MS) / ATTN_FWD_MS

LAYER_PARAMS = H * (H + 2 * KV * HD) + H * H + 3 * H * FFN + 2 * H
PARAMS = L * LAYER_PARAMS + 2 * VOCAB * H + H  # embedding, head, final norm
GIB = 1024 ** 3

# torchtitan docs/performance.md, Table 2: Llama 3.1 8B, 8 H100 (96 GB
# HBM2e, 500 W), FSDP + CP + torch.compile + Float8, local batch 1, full
# activation checkpointing.
TORCHTITAN = {(131072, 4): ("FSDP 2, CP 4", 1071, 84.0),
              (262144, 8): ("FSDP 1, CP 8", 548, 84.5)}


def matmul_flops_per_token():
    """Forward GEMM FLOPs of one layer per token (qkv with the kv heads,
    output projection, SwiGLU's three matrices)."""
    return 2 * (H * (H + 2 * KV * HD) + H * H + 3 * H * FFN)


def model_flops(seq):
    """Training FLOPs of one sequence (model FLOPs: 3x the forward, no
    recomputation): GEMMs, the head and causal attention's pairs."""
    pairs = seq * (seq + 1) / 2
    fwd = seq * (L * matmul_flops_per_token() + 2 * H * VOCAB) \
        + L * 4 * HEADS * HD * pairs
    return 3 * fwd


def job_config(seq, cp, dp_ranks, gpus_per_node, comm="ring", layers=L,
               overlap=False):
    """mapp-sim config: dp_ranks data-parallel ranks including cp."""
    n = seq  # tokens at cp = 1 (the config's convention; the sim divides)
    gemm_us = lambda flops: flops / (GEMM_TFLOPS * 1e12) * 1e6
    stream_us = lambda b: b / (MEM_GBPS * 1e9) * 1e6
    # Position-local work of a layer over all S tokens: GEMMs + the norms,
    # residuals, rotary and SwiGLU's elementwise traffic.
    layer_us = gemm_us(n * matmul_flops_per_token()) + \
        stream_us(E * n * (16 * H + 3 * FFN))
    # The head and the loss: forward + backward (2x) of the [S, V] GEMM and
    # the fp32 logits' softmax; the sim has one last-stage op for both.
    head_us = 3 * gemm_us(2 * n * H * VOCAB) + stream_us(3 * 4 * n * VOCAB)
    embed_us = stream_us(2 * E * n * H)
    zero_n = dp_ranks
    persistent = PARAMS * (10 + 8 / zero_n)
    return {
        "comment": "bench/cp/llama8b_128k.py: Llama-3-8B, seq %d, cp %d, "
                   "%d data-parallel ranks" % (seq, cp, dp_ranks),
        "dp": dp_ranks, "cp": cp, "cp_comm": comm,
        "layers": layers, "microbatches": 1, "steps": 1,
        "seq_len": seq, "heads": HEADS, "kv_heads": KV, "head_dim": HD,
        "dtype_bytes": E, "batch_rows": 1,
        "layer_forward_us": layer_us, "backward_factor": 2.0,
        "attention_tflops": ATTN_TFLOPS,
        "attention_backward_factor": ATTN_BWD_FACTOR,
        "recompute": "full",
        "embedding_us": embed_us, "loss_us": head_us,
        # AdamW streams 28 bytes a parameter, over N under ZeRO-1.
        "optimizer_us": stream_us(28 * PARAMS / zero_n),
        "dp_allreduce_bytes": int(4 * PARAMS),
        "grad_norm_allreduce": False,
        "overlap_grad_reduce": overlap,
        "persistent_bytes": int(persistent),
        # Full recomputation keeps each layer's input; recomputing one layer
        # holds its activations (norms, q/k/v, attention out, SwiGLU's wide
        # tensors); the fp32 logits and their gradient.
        "layer_stash_bytes": E * n * H,
        "working_bytes": E * n * (10 * H + 3 * FFN) + 2 * 4 * n * VOCAB,
        "network": {"gpus_per_node": gpus_per_node,
                    "intra_gbps": 3600, "intra_latency_us": 2,
                    "gbps": 400, "latency_us": 5},
    }


def run_sim(binary, cfg):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    try:
        p = subprocess.run([binary, "--config", path], capture_output=True,
                           text=True, timeout=600)
    finally:
        os.unlink(path)
    if p.returncode:
        sys.exit("mapp-sim failed: " + p.stderr)
    step = float(re.search(r"mean step ([0-9.]+) ms", p.stdout).group(1))
    m = re.search(r"cp transfers ([0-9.]+) ms per step, exposed ([0-9.]+)",
                  p.stdout)
    peak = float(re.search(r"peak memory ([0-9.]+) GiB", p.stdout).group(1))
    return step, float(m.group(1)), float(m.group(2)), peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--layers", type=int, default=L,
                    help="layers to simulate (a smoke run; figures need 32)")
    ap.add_argument("--attention-tflops", type=float, default=ATTN_TFLOPS,
                    help="the attention core's forward rate (sensitivity)")
    a = ap.parse_args()
    binary = os.path.join(a.bin, "mapp-sim")
    rows = []
    # (seq, cp, data-parallel ranks incl. cp, GPUs, comm, overlapped
    # gradient reduction: Megatron's overlap_grad_reduce, not mapp's today)
    layouts = [(131072, 8, 8, 8, "ring", False), (131072, 8, 8, 8, "a2a", False),
               (131072, 8, 64, 64, "ring", False),
               (131072, 8, 64, 64, "ring", True),
               (131072, 4, 8, 8, "ring", False),
               (262144, 8, 8, 8, "ring", False)]
    print(f"Llama-3-8B ({PARAMS / 1e9:.2f}B parameters), bf16, full recompute; "
          f"attention {a.attention_tflops:.0f} TFLOP/s fwd, bwd {ATTN_BWD_FACTOR:.2f}x")
    print(f"{'seq':>7} {'GPUs':>4} {'layout':<16} {'step_s':>8} {'tok/s/GPU':>9} "
          f"{'MFU':>6} {'cp_comm_ms':>10} {'exposed_ms':>10} {'peak_GiB':>8} "
          f"{'FSDP_GiB':>8}  torchtitan (TPS/GPU, GiB)")
    for seq, cp, dpr, gpus, comm, overlap in layouts:
        cfg = job_config(seq, cp, dpr, 8, comm, a.layers, overlap)
        cfg["attention_tflops"] = a.attention_tflops
        step_ms, cp_ms, exposed_ms, peak = run_sim(binary, cfg)
        step = step_ms / 1e3
        tokens = seq * (dpr // cp)  # one sequence per cp group
        tps = tokens / step / gpus
        mfu = model_flops(seq) * (dpr // cp) / step / (gpus * PEAK_TFLOPS * 1e12)
        fsdp = peak - cfg["persistent_bytes"] / GIB + PARAMS * 18 / dpr / GIB
        layout = (f"cp{cp} {comm}" + (f" x dp{dpr // cp}" if dpr > cp else "")
                  + (" +ovl" if overlap else ""))
        tt = TORCHTITAN.get((seq, cp)) if gpus == 8 and comm == "ring" else None
        ref = f"{tt[0]}: {tt[1]:,}, {tt[2]}" if tt else ""
        print(f"{seq:>7} {gpus:>4} {layout:<16} {step:>8.3f} {tps:>9.0f} "
              f"{mfu:>6.1%} {cp_ms:>10.1f} {exposed_ms:>10.1f} {peak:>8.1f} "
              f"{fsdp:>8.1f}  {ref}")
        rows.append({"seq": seq, "gpus": gpus, "cp": cp, "cp_comm": comm,
                     "overlap_grad_reduce": overlap,
                     "dp_ranks": dpr, "step_s": step, "tokens_per_s_per_gpu": tps,
                     "mfu": mfu, "cp_comm_ms": cp_ms, "cp_exposed_ms": exposed_ms,
                     "peak_gib_zero1": peak, "peak_gib_fsdp": fsdp,
                     "torchtitan": tt, "layers": a.layers})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""PyTorch timings for bench/gpu/gqa.sh: causal bf16 grouped-query attention
forward and forward+backward on mapp-attn-bench --gqa's shapes, q [B, heads,
T, D] and k, v [B, kv, T, D] viewed from the [B, T, *, D] layout training
makes, timed with CUDA events (3 warm-up runs, median of ITERS):

  torch-gqa-<backend>   F.scaled_dot_product_attention(..., enable_gqa=True)
                        (torch >= 2.5) under each SDPA backend that takes it;
  torch-repeat-flash    HF's repeat_kv (k, v repeat_interleave'd to every
                        query head, the repeat and its backward included)
                        then flash SDPA: what GQA cost before enable_gqa.

Usage: gqa_torch.py [ITERS]   Prints one JSON line per (shape, impl).
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# name, B, heads, kv heads, T, D: attn_bench.cu's kGqaShapes.
SHAPES = [("l3-8b", 2, 32, 8, 2048, 128), ("l3-8b/tp4", 4, 8, 2, 2048, 128),
          ("70b/tp8", 4, 8, 1, 2048, 128), ("mqa-d64", 4, 16, 1, 1024, 64),
          ("l3-1b", 4, 32, 8, 2048, 64), ("l3-1b-8k", 1, 32, 8, 8192, 64),
          ("l3-1b-16k", 1, 32, 8, 16384, 64), ("l3-8b-8k", 1, 32, 8, 8192, 128),
          ("l3-8b-16k", 1, 32, 8, 16384, 128), ("pythia-d80", 2, 32, 32, 2048, 80),
          ("phi3-d96", 2, 32, 32, 2048, 96), ("gemma2-d256", 2, 8, 4, 2048, 256)]


def timed(fn, iters):
    times = []
    for i in range(iters + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    backends = [("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    for name, b, heads, kv, t, d in SHAPES:
        def make(h):
            x = torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16)
            return x.transpose(1, 2).requires_grad_(True)
        q, k, v = make(heads), make(kv), make(kv)
        do = make(heads).detach()
        group = heads // kv
        impls = [("torch-gqa-" + label, backend, True) for label, backend in backends]
        impls.append(("torch-repeat-flash", SDPBackend.FLASH_ATTENTION, False))
        for label, backend, native in impls:
            row = {"shape": name, "impl": label}

            def attend():
                if native:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=True)
                kr = k.repeat_interleave(group, dim=1)
                vr = v.repeat_interleave(group, dim=1)
                return F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            attend()

                    def fwd_bwd():
                        torch.autograd.grad(attend(), (q, k, v), do)

                    row["fwd_ms"] = timed(fwd, iters)
                    row["fwd_bwd_ms"] = timed(fwd_bwd, iters)
            except Exception as e:  # backend or enable_gqa not available here
                row["error"] = str(e).splitlines()[0][:200]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

"""PyTorch reference timings for bench/gpu/attn.sh: causal bf16
scaled_dot_product_attention forward and forward+backward on the shapes of
mapp-attn-bench, q/k/v laid out as GPT training makes them ([B,T,heads,D]
viewed as [B,heads,T,D]), per SDPA backend (flash, and cudnn where torch has
it), timed with CUDA events: 3 warm-up runs, median of ITERS.

Usage: attn_torch.py [ITERS]   Prints one JSON line per (shape, backend).
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [("1.3b", 8, 16, 2048, 128), ("124m", 8, 12, 1024, 64)]


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
    backends = [("flash", SDPBackend.FLASH_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
    for name, b, heads, t, d in SHAPES:
        def make():
            x = torch.randn(b, t, heads, d, device="cuda", dtype=torch.bfloat16)
            return x.transpose(1, 2).requires_grad_(True)
        q, k, v = make(), make(), make()
        do = make().detach()
        for label, backend in backends:
            row = {"shape": name, "impl": "torch-" + label}
            try:
                with sdpa_kernel([backend]):
                    def fwd():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwd_bwd():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(o, (q, k, v), do)

                    row["fwd_ms"] = timed(fwd, iters)
                    row["fwd_bwd_ms"] = timed(fwd_bwd, iters)
            except Exception as e:  # backend not available for this shape
                row["error"] = str(e).splitlines()[0][:200]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

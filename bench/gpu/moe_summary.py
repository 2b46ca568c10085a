"""Side-by-side table of bench/gpu/moe.sh: mapp (cuda) vs torch eager/compile
on the MoE GPT, ratio last.

Usage: moe_summary.py LOGDIR CFG.json
mapp's ms/step is the median of its per-step lines (stdout, `step_ms`)
after the first three (warm-up: cuBLASLt heuristics, allocations); torch's
the median its script printed. FLOPs per step: 6·N_active·tokens +
6·L·s·h·tokens (attention), MFU against 806 TFLOP/s (shared/DEVICE.md).
"""
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_moe import active_params  # noqa: E402  (imports torch; it is there)

log, cfgpath = sys.argv[1], sys.argv[2]
c = json.load(open(cfgpath))
name = os.path.basename(cfgpath)[:-5]
act, tot = active_params(c)
L, h, s, B = c["num_layers"], c["hidden_size"], c["seq_length"], c["micro_batch_size"]
tokens = B * s
flops = 6 * act * tokens + 6 * L * s * h * tokens


def mapp_row(path):
    if not os.path.exists(path):
        return None, None
    ms, peak = [], None
    for line in open(path):
        m = re.search(r"step_ms ([0-9.]+)", line)
        if m:
            ms.append(float(m.group(1)))
        if line.startswith("mapp-run: peak device memory"):
            peak = float(line.split()[4])
    ms = ms[3:] or ms
    return (statistics.median(ms) if ms else None), peak


res, peak, extra = {}, {}, {}
for impl, f in (("mapp-cuda", "mapp"), ("mapp-cuda(sync)", "mapp-sync")):
    ms, pk = mapp_row(os.path.join(log, f"{name}.{f}.log"))
    if ms:
        res[impl], peak[impl] = ms, pk
for mode in ("eager", "compile"):
    p = os.path.join(log, f"{name}.torch-{mode}.json")
    try:
        r = json.loads(open(p).read().strip().splitlines()[-1])
        res[f"torch-{mode}"] = r["ms_per_step"]
        peak[f"torch-{mode}"] = r.get("peak_gib")
        extra[f"torch-{mode}"] = r.get("grouped", "")
    except Exception:
        pass
rows = [f"{name}: {act / 1e9:.2f}B active of {tot / 1e9:.2f}B parameters, "
        f"{c['num_moe_experts']} experts top-{c['moe_router_topk']}, {tokens} tokens/step"]
for impl, ms in res.items():
    pk = peak.get(impl)
    rows.append(f"  {impl:16s} {ms:8.1f} ms/step {tokens / ms:8.1f}k tok/s "
                f"MFU {flops / (ms * 1e-3) / 806e12 * 100:5.1f}%  peak "
                + (f"{pk:5.1f} GiB" if pk else "    ?    ")
                + (f"  ({extra[impl]})" if extra.get(impl) else ""))
if "mapp-cuda" in res:
    m = res["mapp-cuda"]
    ratios = [f"{k}/mapp = {v / m:.2f}x" for k, v in res.items() if k.startswith("torch")]
    rows.append(f"{name} speed-up of mapp (torch ms / mapp ms; goal >= 1.0): "
                + (", ".join(ratios) if ratios else "no torch results"))
else:
    rows.append(f"{name}: no mapp result")
print("\n".join(rows))

#!/usr/bin/env bash
# Grouped-query attention alone, on the GPU machine: mapp's attention and
# attention_grad kernels (own mma.sync and cuDNN, k/v of kv < heads heads;
# checked against an fp64 reference summing dK, dV over each group) timed by
# mapp-attn-bench --gqa, side by side with PyTorch's SDPA enable_gqa and with
# repeat_kv + flash (gqa_torch.py). Runs from the folder bench/gpu/prepare.sh
# filled:
#   gpu/cuda/gqa.sh [ITERS]
# Ends with a PASS/FAIL line (correctness of every mapp implementation that
# ran); ratios are mapp's time over the fastest PyTorch row of the shape.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
ITERS=${1:-20}
BIN=/tmp/mapp-cuda-bin
mkdir -p $BIN
[ -x $BIN/mapp-attn-bench ] || { xz -dc "$D/bin/mapp-attn-bench.xz" > $BIN/mapp-attn-bench && chmod +x $BIN/mapp-attn-bench; }
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
if [ -z "${MAPP_CUDNN_LIB:-}" ]; then
  CUDNN_DIR=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(os.path.dirname(nvidia.cudnn.__file__), 'lib'))" 2>/dev/null)
  [ -f "$CUDNN_DIR/libcudnn.so.9" ] && export MAPP_CUDNN_LIB=$CUDNN_DIR/libcudnn.so.9
fi
LOG=/tmp/mapp-log/gqa
mkdir -p $LOG
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1)"
timeout 200 python3 "$D/gqa_torch.py" "$ITERS" > $LOG/torch.jsonl 2> $LOG/torch.err \
  || { echo "torch timing failed:"; tail -5 $LOG/torch.err; }
timeout 400 $BIN/mapp-attn-bench --gqa "$ITERS" > $LOG/mapp.txt 2> $LOG/mapp.err
RC=$?
echo "== mapp-attn-bench --gqa rc=$RC (stderr tail):"; tail -5 $LOG/mapp.err
python3 - "$LOG/mapp.txt" "$LOG/torch.jsonl" "$RC" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("ROW ")]
torch = {}
for l in open(sys.argv[2]):
    try:
        r = json.loads(l)
    except ValueError:
        continue
    torch.setdefault(r["shape"], []).append(r)
print("\n================ grouped-query attention (causal bf16, median ms; "
      "x = time / fastest torch row of the shape)")
print(f"{'shape':10} {'impl':19} {'fwd':>8} {'fwd+bwd':>9} {'fwd x':>6} {'f+b x':>6}"
      f"  errors O/dQ/dK/dV  check")
shapes = []
for r in rows:
    if r[1] not in shapes:
        shapes.append(r[1])
for s in torch:
    if s not in shapes:
        shapes.append(s)
ok = sys.argv[3] == "0" and bool(rows)
for s in shapes:
    ts = [t for t in torch.get(s, []) if "fwd_ms" in t]
    bf = min((t["fwd_ms"] for t in ts), default=0)
    bfb = min((t["fwd_bwd_ms"] for t in ts), default=0)
    for t in torch.get(s, []):
        if "fwd_ms" in t:
            print(f"{s:10} {t['impl']:19} {t['fwd_ms']:8.3f} {t['fwd_bwd_ms']:9.3f} "
                  f"{t['fwd_ms']/bf:6.2f} {t['fwd_bwd_ms']/bfb:6.2f}")
        else:
            print(f"{s:10} {t['impl']:19} unavailable: {t.get('error')}")
    for r in rows:
        if r[1] != s:
            continue
        if r[3] == "unavailable:":
            print(f"{s:10} {'mapp-' + r[2]:19} unavailable: {' '.join(r[4:])[:300]}")
            continue
        f, fb = float(r[3]), float(r[4])
        print(f"{s:10} {'mapp-' + r[2]:19} {f:8.3f} {fb:9.3f} {f/bf if bf else 0:6.2f} "
              f"{fb/bfb if bfb else 0:6.2f}  {r[7]} {r[8]} {r[9]} {r[10]}  {r[11]}")
        ok &= r[11] in ("PASS", "UNCHECKED")  # UNCHECKED: past the fp64 reference's length
print("gqa:", "PASS" if ok else "FAIL", "(correctness of every mapp implementation that ran)")
PY

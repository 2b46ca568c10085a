#!/usr/bin/env bash
# Attention alone, on the GPU machine: mapp's implementations (own mma.sync
# kernels, cuDNN's fused SDPA) timed and checked against an fp64 reference by
# mapp-attn-bench, next to PyTorch's SDPA on the same shapes. Runs from the
# folder bench/gpu/prepare.sh filled:
#   gpu/cuda/attn.sh [ITERS]
# cuDNN comes from PyTorch's wheels (nvidia/*/lib, with the nvrtc it needs);
# MAPP_CUDNN_LIB overrides the library. Ends with a PASS/FAIL summary.
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
LOG=/tmp/mapp-log/attn
mkdir -p $LOG
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "cuDNN library: ${MAPP_CUDNN_LIB:-default search}; torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1)"
echo "nvidia lib dirs: $NVLIBS" | tr ':' '\n' | head -20
timeout 150 python3 "$D/attn_torch.py" "$ITERS" > $LOG/torch.jsonl 2> $LOG/torch.err \
  || { echo "torch timing failed:"; tail -5 $LOG/torch.err; }
MAPP_CUDNN_VERBOSE=1 timeout 300 $BIN/mapp-attn-bench "$ITERS" > $LOG/mapp.txt 2> $LOG/mapp.err
RC=$?
echo "== mapp-attn-bench rc=$RC (stderr tail):"; tail -20 $LOG/mapp.err
grep -v "^ROW" $LOG/mapp.txt
python3 - "$LOG/mapp.txt" "$LOG/torch.jsonl" "$RC" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("ROW ")]
torch = {}
for l in open(sys.argv[2]):
    try:
        r = json.loads(l)
    except ValueError:
        continue
    torch[(r["shape"], r["impl"])] = r
print("\n================ attention (causal bf16, median ms; ratio = time / torch-flash)")
print(f"{'shape':6} {'impl':12} {'fwd':>8} {'fwd+bwd':>9} {'fwd x':>6} {'f+b x':>6} "
      f"{'TF/s f':>7} {'TF/s fb':>7}  errors O/dQ/dK/dV  check")
shapes = []
for r in rows:
    if r[1] not in shapes:
        shapes.append(r[1])
ok = sys.argv[3] == "0" and bool(rows)
goal = []
for s in shapes:
    ref = torch.get((s, "torch-flash"), {})
    rf, rfb = ref.get("fwd_ms"), ref.get("fwd_bwd_ms")
    for impl in ("torch-flash", "torch-cudnn"):
        t = torch.get((s, impl))
        if t and "fwd_ms" in t:
            print(f"{s:6} {impl:12} {t['fwd_ms']:8.3f} {t['fwd_bwd_ms']:9.3f} "
                  f"{t['fwd_ms']/rf if rf else 0:6.2f} {t['fwd_bwd_ms']/rfb if rfb else 0:6.2f}")
        elif t:
            print(f"{s:6} {impl:12} unavailable: {t.get('error')}")
    for r in rows:
        if r[1] != s:
            continue
        if r[3] == "unavailable:":
            print(f"{s:6} {r[2]:12} unavailable: {' '.join(r[4:])[:300]}")
            continue
        f, fb = float(r[3]), float(r[4])
        print(f"{s:6} {r[2]:12} {f:8.3f} {fb:9.3f} {f/rf if rf else 0:6.2f} "
              f"{fb/rfb if rfb else 0:6.2f} {r[5]:>7} {r[6]:>7}  {r[7]} {r[8]} {r[9]} {r[10]}  {r[11]}")
        ok &= r[11] == "PASS"
        if rfb and r[11] == "PASS":
            goal.append((fb / rfb, s, r[2]))
best = {}
for ratio, s, impl in sorted(goal):
    best.setdefault(s, (ratio, impl))
for s, (ratio, impl) in best.items():
    print(f"goal {s}: best mapp fwd+bwd = {ratio:.2f}x torch-flash ({impl}) -> "
          f"{'met' if ratio <= 1.2 else 'NOT met'} (target <= 1.2x)")
print("attn:", "PASS" if ok else "FAIL", "(correctness of every implementation that ran)")
PY

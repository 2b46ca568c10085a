#!/usr/bin/env bash
# CUDA epilogue fusion check (docs/cuda-backend.md, "Epilogue fusion"), on
# the GPU machine, from the folder bench/gpu/prepare.sh filled:
#   gpu/cuda/fuse.sh [STEPS_124M] [STEPS_1B3] [ROUNDS_124M] [ROUNDS_1B3]
# 1. mapp-cuda-kernel-test (every kernel vs fp64 references, the fused
#    pairs vs unfused vs fp64, and the multi-tensor adamw/sgd groups vs the
#    per-parameter kernels, bit for bit);
# 2. the 124M and 1.3B bench plans with MAPP_CUDA_FUSE=0, =gelu,bgrad,accumulate
#    (everything but the optimizer groups) and =1 interleaved,
#    same seed and batches: median step time after 3 warm-up steps, speedup,
#    and the largest relative loss difference between the two (≤ 2e-2, the
#    e2e tolerance; bench/gpu.sh check still runs the PyTorch comparison);
#    =1 must report an adam group (MAPP_CUDA_FUSE_LOG).
# Prints PASS/FAIL and the figures last. Logs in $OUT (when set) or /tmp.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
S124=${1:-15}
S13=${2:-8}
R124=${3:-2}
R13=${4:-1}
LOG=${OUT:-/tmp/mapp-fuse}
mkdir -p "$LOG"
export PYTHONPATH=$D${PYTHONPATH:+:$PYTHONPATH} # runstats.py
source "$D/common.sh"
unpack mapp-run mapp-cuda-kernel-test

echo "== kernel test"
if timeout 150 $BIN/mapp-cuda-kernel-test > "$LOG/fuse-kernels.log" 2>&1; then
  say "kernels: $(tail -1 "$LOG/fuse-kernels.log")"
else
  grep FAIL "$LOG/fuse-kernels.log" | head -20
  record "kernels: FAILED ($(tail -1 "$LOG/fuse-kernels.log"))" 1
fi
grep -i "fused\|fusion" "$LOG/fuse-kernels.log" | head -30

for c in gpt-124m gpt-1.3b; do
  steps=$S124 rounds=$R124
  [ $c = gpt-1.3b ] && steps=$S13 rounds=$R13
  for r in $(seq 1 "$rounds"); do
    # pairs: the epilogue fusions without the optimizer groups, so that
    # pairs → 1 is what the multi-tensor optimizer launch alone gains.
    for f in 0 pairs 1; do
      v=$f
      [ $f = pairs ] && v=gelu,bgrad,accumulate
      echo "== $c MAPP_CUDA_FUSE=$v round $r"
      MAPP_CUDA_FUSE=$v MAPP_CUDA_FUSE_LOG=1 timeout 200 $BIN/mapp-run \
        "$D/plans/$c.mplan" --backend=cuda --data "$D/corpus.jsonl" \
        --tokenizer bytes --steps "$steps" --seed 11 --quiet \
        --metrics "$LOG/$c.fuse$f.r$r.jsonl" > "$LOG/$c.fuse$f.r$r.log" 2>&1 \
        || { tail -3 "$LOG/$c.fuse$f.r$r.log"; record "$c fuse=$f: mapp-run failed" 1; }
      grep "mapp cuda fusion" "$LOG/$c.fuse$f.r$r.log" | head -1
    done
  done
  # MAPP_CUDA_FUSE=1 must include the optimizer groups (one per plan).
  groups=$(grep -o "adam [0-9]* ([0-9]* instrs)" "$LOG/$c.fuse1.r1.log" | head -1)
  say "$c fused: ${groups:-no adam groups reported}"
  case "$groups" in "adam 0 "*|"") FAILED=1 ;; esac
  line=$(python3 - "$LOG" "$c" <<'PY'
import glob, sys
from runstats import steps, median_step_ms, max_rel_loss_diff
log, c = sys.argv[1], sys.argv[2]
def runs(f):
    return [steps(p) for p in sorted(glob.glob(f"{log}/{c}.fuse{f}.r*.jsonl"))]
r0, rp, r1 = runs(0), runs("pairs"), runs(1)
if not r0 or not r1 or not r0[0] or not r1[0]:
    print(f"{c}: no metrics"); sys.exit(1)
t0, t1 = median_step_ms(*r0), median_step_ms(*r1)
diff = max_rel_loss_diff(r0[0], r1[0])
ok = diff <= 2e-2
opt = ""
if rp and rp[0]:
    tp = median_step_ms(*rp)
    opt = (f"; optimizer groups alone: {tp:.1f} -> {t1:.1f} ms/step "
           f"({tp / t1:.3f}x)")
print(f"{c}: unfused {t0:.1f} ms/step, fused {t1:.1f} ms/step, speedup "
      f"{t0 / t1:.3f}x; max rel loss diff {diff:.2e} over {len(r0[0])} steps "
      f"{'ok' if ok else 'FAIL (> 2e-2)'}{opt}")
sys.exit(0 if ok else 1)
PY
)
  record "$line" $?
done
finish fuse

#!/usr/bin/env bash
# NCCL across GPUs (needs >= 2 GPUs): the comm.sh GPT plans (tp2, pp2, dp2)
# with --comm=nccl, rank r on GPU r, against the single-rank run on the same
# weights and data; max relative per-step loss difference (tolerance as
# comm.sh's bf16: 3e-2). Then dp2 again with grad_sync synchronous
# (MAPP_NCCL_SYNC_GRADS=1) against the default run, whose gradient
# all-reduce overlaps the backward: only the ordering differs, so losses and
# gradient norms must be bit-identical — unless the backend itself is not
# deterministic run to run (fp32 atomics in embedding_grad / attention dQ):
# a repeat of the overlapped run tells which, and then the check falls back
# to 1e-3 relative. Prints both median step times. Runs from the folder
# bench/gpu/prepare.sh fills:
#   gpu/cuda/nccl.sh [STEPS]
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-30}
LOG=/tmp/mapp-nccl-log; mkdir -p $LOG
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$D NCCL_NVLS_ENABLE=0 MAPP_CUDA_GEMM_TUNE=0
BIN=/tmp/mapp-cuda-bin; mkdir -p $BIN
[ -x $BIN/mapp-run ] || { xz -dc "$D/bin/mapp-run.xz" > $BIN/mapp-run && chmod +x $BIN/mapp-run; }
nvidia-smi --query-gpu=index,name --format=csv,noheader
python3 "$D/e2e_check.py" init "$D/configs/gpt-e2e.json" $LOG/init.safetensors > $LOG/init.log 2>&1
run() { # NAME PLAN [FLAGS]
  local name=$1 plan=$2; shift 2
  timeout 120 $BIN/mapp-run "$D/plans/comm/$plan.mplan" --backend=cuda --data "$D/corpus.jsonl" \
    --tokenizer bytes --steps "$STEPS" --seed 11 --weights $LOG/init.safetensors \
    --metrics $LOG/$name.jsonl --quiet "$@" > $LOG/$name.log 2>&1 ||
    { echo "FAIL $name: mapp-run failed"; tail -5 $LOG/$name.log; return 1; }
}
run single single
for l in tp2pp1dp1 tp1pp2dp1 tp1pp1dp2; do
  run $l-nccl $l --comm=nccl || continue
  python3 - $LOG/$l-nccl.jsonl $LOG/single.jsonl $l <<'PY'
import json, sys
got, ref = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref)) if got and len(got) == len(ref) else float("inf")
ok = worst <= 3e-2 and got[-1] < got[0]
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]} nccl (2 GPUs) vs single: max rel loss diff {worst:.2e} (tol 3e-2); loss {got[0]:.4f} -> {got[-1]:.4f}")
PY
done

# --- grad_sync overlapped with the backward vs synchronous (dp2)
# Only the order of the same NCCL calls changes, but the runs are not
# bit-reproducible (cuBLASLt/cuDNN/atomic sums vary at ~1e-5 between runs,
# step 0 included) and this model at lr 1e-3 has a loss spike near step 18
# that amplifies any difference (measured 2026-11-29: 2.9e-1 there). So the
# first COMPARE_STEPS (10) steps' losses and grad norms are compared with a
# 1e-3 relative tolerance, next to a repeat of the overlapped run.
compare_first() { # A.jsonl B.jsonl: the max relative difference
  python3 - "$1" "$2" "${COMPARE_STEPS:-10}" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
k = int(sys.argv[3])
if len(a) < k or len(b) < k:
    print("inf"); sys.exit()
print(f"{max(abs(x[f] - y[f]) / max(abs(y[f]), 1e-30) for x, y in zip(a[:k], b[:k]) for f in ('loss', 'grad_norm')):.2e}")
PY
}
median_ms() { python3 -c "import json,sys,statistics; print(f'{statistics.median([json.loads(l)[\"step_ms\"] for l in open(sys.argv[1])][3:]):.2f}')" "$1"; }
if [ -s $LOG/tp1pp1dp2-nccl.jsonl ] && MAPP_NCCL_SYNC_GRADS=1 run dp2-sync tp1pp1dp2 --comm=nccl &&
   run dp2-repeat tp1pp1dp2 --comm=nccl; then
  diff=$(compare_first $LOG/tp1pp1dp2-nccl.jsonl $LOG/dp2-sync.jsonl)
  noise=$(compare_first $LOG/tp1pp1dp2-nccl.jsonl $LOG/dp2-repeat.jsonl)
  times="step ms (median after 3): overlapped $(median_ms $LOG/tp1pp1dp2-nccl.jsonl), synchronous $(median_ms $LOG/dp2-sync.jsonl)"
  python3 - "$diff" "$noise" "$times" <<'PY'
import sys
diff, noise, times = sys.argv[1:4]
ok = float(diff) <= 1e-3
print(f"{'PASS' if ok else 'FAIL'} dp2 overlapped vs synchronous grad_sync, first steps: max rel diff {diff} (tol 1e-3; overlapped vs its repeat {noise}); {times}")
PY
else
  echo "FAIL dp2 synchronous grad_sync: no run to compare"
fi

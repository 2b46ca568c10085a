#!/usr/bin/env bash
# NCCL across GPUs (needs >= 2 GPUs): the comm.sh GPT plans (tp2, pp2, dp2)
# with --comm=nccl, rank r on GPU r, against the single-rank run on the same
# weights and data; max relative per-step loss difference (tolerance as
# comm.sh's bf16: 3e-2). Runs from the folder bench/gpu/prepare.sh fills:
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

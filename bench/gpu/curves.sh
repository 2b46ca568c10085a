#!/usr/bin/env bash
# 100-step bf16 loss curves of the benchmark models against PyTorch (issues
# 35 and 37), each plan unfused and fused, on the GPU machine. Runs from
# the folder bench/gpu/prepare_fusion.sh filled:
#   gpu/fusion/curves.sh [STEPS]
# Per model: the initial weights (mapp.reference.GPT, seed 7), mapp-run
# --backend=cuda of each plan (CURVE_PLANS, default plain fused norms) on
# the same batches (checked equal), then
# e2e_check.py (one PyTorch bf16-autocast run against all; --no-fp32) and
# the plans' median step times. Logs in $OUT (or /tmp); summary last.
# CURVE_FP32: models whose PyTorch side also runs in fp32. A plan name
# with "+f32" (e.g. fused+f32) runs that plan with MAPP_CUDA_STORAGE=f32
# (fp32 activations and GEMMs): a curve with bf16 storage ruled out.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-100}
LOG=${OUT:-/tmp/mapp-curves}
mkdir -p "$LOG"
source "$D/common.sh" # unpack, say, with_torch_libs
with_torch_libs
BIN=/tmp/mapp-fusion-bin # this package's binary, not another's left on the machine
mkdir -p $BIN && rm -f $BIN/mapp-run && unpack mapp-run
W=/tmp/mapp-curves-work
mkdir -p $W
median() { python3 -c "import json, statistics, sys; s = [json.loads(l)['step_ms'] for l in open(sys.argv[1])][3:]; print('%.1f' % statistics.median(s))" "$1"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for c in ${CURVE_MODELS:-$(cd "$D/configs" && ls *.curve.json | sed 's/\.curve\.json$//')}; do
  t=$SECONDS
  python3 "$D/e2e_check.py" init "$D/configs/$c.curve.json" $W/$c.init.safetensors \
    || { say "curve $c: init failed"; continue; }
  runs=()
  for v in ${CURVE_PLANS:-plain fused norms}; do
    storage=(); [[ $v == *+f32 ]] && storage=(MAPP_CUDA_STORAGE=f32)
    if env "${storage[@]}" $BIN/mapp-run "$D/plans/$c.curve.${v%+f32}.mplan" --backend=cuda --data "$D/corpus.jsonl" \
        --tokenizer bytes --steps "$STEPS" --seed 11 --weights $W/$c.init.safetensors \
        --metrics "$LOG/$c.$v.jsonl" --dump-batches $W/$c.$v.batches.jsonl --quiet \
        > "$LOG/$c.$v.log" 2>&1; then
      runs+=($v)
    else
      tail -3 "$LOG/$c.$v.log"; say "curve $c $v: mapp-run failed"
    fi
  done
  [ ${#runs[@]} -gt 0 ] || continue
  b=$W/$c.${runs[0]}.batches.jsonl
  same=1
  for v in "${runs[@]}"; do cmp -s $b $W/$c.$v.batches.jsonl || same=0; done
  [ $same = 1 ] || { say "curve $c: the runs read different batches"; continue; }
  list=$(for v in "${runs[@]}"; do printf '%s=%s,' "$c.$v" "$LOG/$c.$v.jsonl"; done)
  # PyTorch's fp32 run too for the models in CURVE_FP32 (the bf16 runs'
  # distance from fp32: the noise floor of the bar).
  flags=(--lr 3e-4 --losses-out "$LOG/$c.torch.json")
  [[ " ${CURVE_FP32:-} " == *" $c "* ]] || flags+=(--no-fp32)
  timeout 400 python3 "$D/e2e_check.py" "$D/configs/$c.curve.json" $W/$c.init.safetensors \
    "${list%,}" $b "${flags[@]}" > "$LOG/$c.e2e.log" 2>&1
  say "$(tail -2 "$LOG/$c.e2e.log" | tr '\n' ' ')"
  say "step $c (micro-batch 2, median of steps 3+): $(for v in "${runs[@]}"; do printf '%s %s ms, ' $v "$(median "$LOG/$c.$v.jsonl")"; done)$((SECONDS - t)) s"
  rm -f $W/$c.*
done
echo "== summary"
printf '%s\n' "${SUMMARY[@]}"

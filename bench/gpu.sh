#!/usr/bin/env bash
# CUDA backend: correctness checks, then the benchmark against PyTorch, on
# the GPU machine. Runs from the folder bench/gpu/prepare.sh filled (it
# copies this script there):
#   gpu/cuda/gpu.sh [all|check|e2e|bench|profile] [STEPS_SMALL] [STEPS_1B3]
# TORCH_MODES (default "eager compile") picks the PyTorch baselines.
# Logs go to $OUT (when set) or /tmp; the last lines are the summary table.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
MODE=${1:-all}
S124=${2:-30}
S13=${3:-12}
LOG=/tmp/mapp-log
mkdir -p $LOG
# cuDNN (fused attention, loaded at run time) and the nvrtc it needs come
# from PyTorch's wheels; MAPP_CUDA_ATTN=own keeps the own kernels.
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$D PYTHONUNBUFFERED=1
BIN=/tmp/mapp-cuda-bin
mkdir -p $BIN
for b in mapp-run mapp-cuda-kernel-test; do
  [ -x $BIN/$b ] || { xz -dc "$D/bin/$b.xz" > $BIN/$b && chmod +x $BIN/$b; }
done
RUN=$BIN/mapp-run
SUMMARY=()
say() { echo "$*"; SUMMARY+=("$*"); }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader

if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  echo "== kernel checks"
  if timeout 240 "$BIN/mapp-cuda-kernel-test" > "$LOG/kernels.log" 2>&1; then
    say "kernels: $(tail -1 "$LOG/kernels.log")"
  else
    grep -E "FAIL" "$LOG/kernels.log" | head -20
    say "kernels: FAILED ($(tail -1 "$LOG/kernels.log"))"
  fi
  # The attention cases again with the own kernels (the default takes cuDNN
  # where it loads).
  if MAPP_CUDA_ATTN=own timeout 120 "$BIN/mapp-cuda-kernel-test" attention > "$LOG/kernels-own-attn.log" 2>&1; then
    say "kernels (MAPP_CUDA_ATTN=own, attention): $(tail -1 "$LOG/kernels-own-attn.log")"
  else
    grep -E "FAIL" "$LOG/kernels-own-attn.log" | head -10
    say "kernels (MAPP_CUDA_ATTN=own, attention): FAILED ($(tail -1 "$LOG/kernels-own-attn.log"))"
  fi
  echo "== compute-sanitizer memcheck"
  if timeout 240 compute-sanitizer --tool memcheck --leak-check full \
      "$BIN/mapp-cuda-kernel-test" > "$LOG/memcheck.log" 2>&1; then
    say "memcheck kernel test: $(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" | tail -1)"
  else
    tail -20 "$LOG/memcheck.log"
    say "memcheck kernel test: FAILED ($(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" | tail -1))"
  fi
  timeout 120 compute-sanitizer --tool memcheck "$RUN" "$D/plans/gpt-e2e.mplan" \
      --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes --steps 2 --quiet \
      > "$LOG/memcheck-run.log" 2>&1
  say "memcheck mapp-run gpt-e2e 2 steps: rc=$? $(grep -E 'ERROR SUMMARY' "$LOG/memcheck-run.log" | tail -1)"
fi

if [ "$MODE" = all ] || [ "$MODE" = check ] || [ "$MODE" = e2e ]; then
  echo "== e2e vs PyTorch"
  for c in gpt-tiny-e2e gpt-e2e llama-e2e; do
    python3 "$D/e2e_check.py" init "$D/configs/$c.json" "$LOG/$c.init.safetensors" \
      || { say "e2e $c: init failed"; continue; }
    "$RUN" "$D/plans/$c.mplan" --backend=cuda --data "$D/corpus.jsonl" \
      --tokenizer bytes --steps 100 --seed 11 --weights "$LOG/$c.init.safetensors" \
      --metrics "$LOG/$c.metrics.jsonl" --dump-batches "$LOG/$c.batches.jsonl" --quiet \
      || { say "e2e $c: mapp-run failed"; continue; }
    say "$(timeout 300 python3 "$D/e2e_check.py" "$D/configs/$c.json" \
      "$LOG/$c.init.safetensors" "$LOG/$c.metrics.jsonl" "$LOG/$c.batches.jsonl" \
      --name "$c" 2>&1 | tail -1)"
  done
  rm -f "$LOG"/*.batches.jsonl "$LOG"/*.safetensors
fi

if [ "$MODE" = profile ]; then
  for c in gpt-124m gpt-1.3b; do
    MAPP_CUDA_PROFILE=1 "$RUN" "$D/plans/$c.mplan" --backend=cuda --data "$D/corpus.jsonl" \
      --tokenizer bytes --steps 4 --quiet 2> "$LOG/$c.profile.txt"
    echo "== $c"; head -30 "$LOG/$c.profile.txt"
  done
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  echo "== benchmark"
  for c in gpt-124m gpt-1.3b; do
    steps=$S124; [ $c = gpt-1.3b ] && steps=$S13
    "$RUN" "$D/plans/$c.mplan" --backend=cuda --data "$D/corpus.jsonl" \
      --tokenizer bytes --steps "$steps" --metrics "$LOG/$c.bench.jsonl" --quiet \
      > "$LOG/$c.run.log" 2>&1 || { tail -3 "$LOG/$c.run.log"; say "bench $c: mapp-run failed"; }
    for m in ${TORCH_MODES-eager compile}; do
      timeout 240 python3 "$D/torch_gpt.py" "$D/configs/$c.json" --mode $m \
        --steps "$steps" --warmup 3 > "$LOG/$c.torch-$m.json" 2> "$LOG/$c.torch-$m.err" \
        || tail -3 "$LOG/$c.torch-$m.err"
    done
  done
  say "$(python3 "$D/summary.py" "$LOG" "$D/configs")"
fi

if [ -n "${OUT:-}" ]; then
  grep -E "FAIL|========= (Invalid|Program hit|ERROR)" $LOG/memcheck.log 2>/dev/null | head -40 > "$OUT/memcheck-errors.txt"
  grep -B2 -A12 "ERROR SUMMARY\|Invalid" $LOG/memcheck.log 2>/dev/null | head -80 > "$OUT/memcheck-detail.txt"
  cp $LOG/kernels.log $LOG/*.profile.txt "$OUT/" 2>/dev/null
  cat $LOG/*.bench.jsonl > "$OUT/bench.jsonl" 2>/dev/null
fi
echo
echo "================ summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader))"
printf '%s\n' "${SUMMARY[@]}"

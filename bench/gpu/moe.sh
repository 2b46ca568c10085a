#!/usr/bin/env bash
# MoE on the CUDA backend (issue #22), on the GPU machine, from the folder
# bench/gpu/prepare_moe.sh filled (staged as gpu/moe/run.sh):
#   bash gpu/moe/run.sh check   the MoE kernel test (and a build with three
#                               deliberate bugs, which must fail it), the e2e
#                               check (CUDA vs PyTorch fp32 and bf16, the CPU
#                               backend with fp32 activations; dropless and
#                               with capacity drops), compute-sanitizer
#   bash gpu/moe/run.sh bench   the 1B-active MoE GPT: mapp vs PyTorch eager
#                               and torch.compile, tokens/s side by side
#   bash gpu/moe/run.sh all     both
# Env: STEPS (bench steps, default 12), E2E_STEPS (default 60), TORCH_MODES
# (default "eager compile").
# Logs: $OUT (when set, at most 8 files) else /tmp/mapp-moe-log; the summary
# is printed last (and written to $OUT/summary.txt).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
MODE=${1:-all}
STEPS=${STEPS:-12}
E2E=${E2E_STEPS:-60}
T0=$(date +%s)
LOG=/tmp/mapp-moe-log
rm -rf $LOG && mkdir -p $LOG
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$D PYTHONUNBUFFERED=1
# Own folder, unpacked every time: never a stale mapp-run of another bundle.
BIN=/tmp/mapp-moe-bin
rm -rf $BIN && mkdir -p $BIN
for b in mapp-run mapp-cuda-moe-test mapp-cuda-moe-test-broken; do
  xz -dc "$D/bin/$b.xz" > $BIN/$b && chmod +x $BIN/$b
done
RUN=$BIN/mapp-run
SUMMARY=()
FAILED=0
say() { echo "$*"; SUMMARY+=("$*"); }
bad() { say "$*"; FAILED=1; }
elapsed() { echo $(( $(date +%s) - T0 )); }

nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader

if [ "$MODE" = all ] || [ "$MODE" = check ]; then
  echo "== MoE kernel test"
  if timeout 240 $BIN/mapp-cuda-moe-test > $LOG/moe-test.log 2>&1; then
    say "moe kernels: $(tail -1 $LOG/moe-test.log)"
  else
    grep -E "FAIL" $LOG/moe-test.log | head -30
    bad "moe kernels: FAILED ($(tail -1 $LOG/moe-test.log))"
  fi
  # The same test against a build with three bugs (router ties to the
  # higher expert, capacity ties to the later token, the last expert's GEMM
  # skipped): each bug's cases in a process of their own, since a bug can
  # fault the device (the tie rule did at k 36 of 72) and end the process
  # before the other bugs' cases run. Each must fail.
  caught=0
  for only in router assign grouped_matmul; do
    timeout 120 $BIN/mapp-cuda-moe-test-broken "$only" > $LOG/moe-test-broken-$only.log 2>&1
    rc=$?
    nf=$(grep -c FAIL $LOG/moe-test-broken-$only.log)
    [ $rc -ne 0 ] && [ "$nf" -gt 0 ] && caught=$((caught + 1))
    echo "broken build, $only cases: rc=$rc, $nf failures"
  done
  if [ $caught -eq 3 ]; then
    say "moe kernels, deliberately broken build: each of the 3 bugs failed its cases -> caught"
  else
    bad "moe kernels, deliberately broken build: $caught of 3 bugs caught -> NOT caught"
  fi
  echo "== e2e: CUDA vs PyTorch fp32 and bf16, the CPU with fp32 activations"
  for c in gpt-moe-e2e gpt-moe-e2e-cap; do
    python3 "$D/moe_check.py" init "$D/configs/$c.json" $LOG/$c.init.safetensors \
      || { bad "e2e $c: init failed"; continue; }
    common=(--data "$D/corpus.jsonl" --tokenizer bytes --seed 11 --weights $LOG/$c.init.safetensors --quiet)
    timeout 180 $RUN "$D/plans/$c.mplan" --backend=cuda --steps $E2E "${common[@]}" \
      --metrics $LOG/$c.cuda.jsonl --dump-batches $LOG/$c.batches.jsonl > $LOG/$c.cuda.log 2>&1 \
      || { tail -5 $LOG/$c.cuda.log; bad "e2e $c: mapp-run cuda failed"; continue; }
    MAPP_CUDA_MOE_COUNTS=sync timeout 120 $RUN "$D/plans/$c.mplan" --backend=cuda --steps 20 "${common[@]}" \
      --metrics $LOG/$c.sync.jsonl > $LOG/$c.sync.log 2>&1 \
      || { tail -5 $LOG/$c.sync.log; bad "e2e $c: mapp-run cuda (sync counts) failed"; continue; }
    timeout 240 $RUN "$D/plans/$c.f32.mplan" --backend=cpu --steps $E2E "${common[@]}" \
      --metrics $LOG/$c.cpu.jsonl > $LOG/$c.cpu.log 2>&1 \
      || { tail -5 $LOG/$c.cpu.log; bad "e2e $c: mapp-run cpu failed"; continue; }
    line=$(timeout 300 python3 "$D/moe_check.py" check "$D/configs/$c.json" $LOG/$c.init.safetensors \
      $LOG/$c.cuda.jsonl $LOG/$c.cpu.jsonl $LOG/$c.batches.jsonl --same $LOG/$c.sync.jsonl \
      --name $c 2>&1 | tee $LOG/$c.check.log | tail -1)
    case "$line" in *PASS) say "$line" ;; *) tail -5 $LOG/$c.check.log; bad "$line" ;; esac
  done
  rm -f $LOG/*.batches.jsonl $LOG/*.safetensors
  echo "== compute-sanitizer memcheck"
  timeout 200 compute-sanitizer --tool memcheck $BIN/mapp-cuda-moe-test > $LOG/memcheck-test.log 2>&1
  rc=$?
  s=$(grep -E 'ERROR SUMMARY' $LOG/memcheck-test.log | tail -1)
  case "$s" in *" 0 errors"*) [ $rc -eq 0 ] && say "memcheck moe test: $s" || bad "memcheck moe test: rc=$rc $s" ;;
    *) grep -B2 -A8 "Invalid\|ERROR" $LOG/memcheck-test.log | head -30; bad "memcheck moe test: rc=$rc $s" ;; esac
  timeout 150 compute-sanitizer --tool memcheck $RUN "$D/plans/gpt-moe-e2e-cap.mplan" --backend=cuda \
    --data "$D/corpus.jsonl" --tokenizer bytes --steps 2 --quiet > $LOG/memcheck-run.log 2>&1
  rc=$?
  s=$(grep -E 'ERROR SUMMARY' $LOG/memcheck-run.log | tail -1)
  case "$s" in *" 0 errors"*) [ $rc -eq 0 ] && say "memcheck mapp-run moe e2e (capacity) 2 steps: $s" || bad "memcheck mapp-run: rc=$rc $s" ;;
    *) grep -B2 -A8 "Invalid\|ERROR" $LOG/memcheck-run.log | head -30; bad "memcheck mapp-run: rc=$rc $s" ;; esac
  say "check took $(elapsed) s"
fi

if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  echo "== benchmark: gpt-moe-1b"
  c=gpt-moe-1b
  P="$D/plans/$c.mplan"
  bench=(--backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes)
  # Per-step lines on stdout (no --metrics: its expert tally reads the
  # counts with a synchronize per layer).
  timeout 300 $RUN "$P" "${bench[@]}" --steps "$STEPS" > $LOG/$c.mapp.log 2>&1 \
    || { tail -5 $LOG/$c.mapp.log; bad "bench $c: mapp-run failed"; }
  for m in ${TORCH_MODES-eager compile}; do
    timeout 300 python3 "$D/torch_moe.py" "$D/configs/$c.json" --mode $m --steps 10 --warmup 3 \
      > $LOG/$c.torch-$m.json 2> $LOG/$c.torch-$m.err \
      || { tail -5 $LOG/$c.torch-$m.err
           if [ $m = eager ]; then bad "bench $c: torch $m failed"; else say "bench $c: torch $m failed (see $c.torch-$m.err)"; fi; }
  done
  # The host-sync variant of the grouped GEMMs' counts, and where mapp's
  # step goes (MAPP_CUDA_PROFILE), while time is left.
  if [ $(elapsed) -lt 300 ]; then
    MAPP_CUDA_MOE_COUNTS=sync timeout 150 $RUN "$P" "${bench[@]}" --steps 8 > $LOG/$c.mapp-sync.log 2>&1 \
      || { tail -3 $LOG/$c.mapp-sync.log; say "bench $c: mapp-run (sync counts) failed"; }
  fi
  if [ $(elapsed) -lt 360 ]; then
    MAPP_CUDA_PROFILE=1 timeout 150 $RUN "$P" "${bench[@]}" --steps 5 --quiet > /dev/null 2> $LOG/$c.profile.txt \
      || say "bench $c: profile run failed"
  fi
  say "$(python3 "$D/moe_summary.py" $LOG "$D/configs/$c.json")"
fi

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  printf '%s\n' "${SUMMARY[@]}" > "$OUT/summary.txt"
  cp $LOG/moe-test.log "$OUT/" 2>/dev/null
  [ -f $LOG/gpt-moe-1b.profile.txt ] && cp $LOG/gpt-moe-1b.profile.txt "$OUT/"
  tar -C $LOG -czf "$OUT/moe-logs.tar.gz" . 2>/dev/null
fi
echo
echo "================ moe $MODE summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null), $(elapsed) s)"
printf '%s\n' "${SUMMARY[@]}"
[ $FAILED -eq 0 ] && echo "PASS" || echo "FAIL"
exit $FAILED

#!/usr/bin/env bash
# Activation recomputation (--mapp-recompute, issue #20 item 4) on the 1.3B
# GPT: tokens/s and peak memory without recompute, with policy=selective and
# with policy=full at the bench micro-batch, and a larger micro-batch that
# only fits with policy=full.
#
# Development machine (bench/gpu/prepare.sh calls it; mapp-opt and
# mapp-translate from $MAPP_BIN, default build/bin):
#   bench/gpu/recompute.sh --prepare OUT [CONFIG] [MBS] [BIG_MBS]
#     CONFIG: bench/gpu/configs/CONFIG.json (default gpt-1.3b), MBS the
#     bench micro-batch (8), BIG_MBS the one that needs recompute (40: the
#     plan without recompute is ~153 GiB, with full ~42 GiB).
#     Writes OUT/plans/recompute/*.mplan, the memory plan's figures of each
#     (*.stats.txt) and meta.txt, and copies this script to OUT.
# Device (the folder prepare.sh filled):
#   gpu/cuda/recompute.sh [STEPS]            (default 10 steps per run)
#   BACKEND=cpu MAPP_RUN=build/bin/mapp-run OUT/recompute.sh 4   (dry run)
# Prints, per run: median ms/step after 3 warm-up steps, tokens/s, peak
# device memory (CUDA) or allocated bytes (CPU), the plan's figures, and the
# largest relative loss difference against the run without recompute (an
# exact rewrite: 0 on the CPU, <= 1e-3 run-to-run noise of atomic kernels on
# CUDA). The big micro-batch: the run without recompute must fail to
# allocate and the full-recompute run must train (CUDA; the CPU dry run
# only reports). PASS/FAIL and the figures last.
set -uo pipefail

if [ "${1:-}" = "--prepare" ]; then
  set -e
  OUTD=$(mkdir -p "$2" && cd "$2" && pwd)
  CONFIG=${3:-gpt-1.3b}
  MBS=${4:-8}
  BIG=${5:-40}
  cd "$(dirname "$0")/../.."
  BINDIR=${MAPP_BIN:-build/bin}
  P="$OUTD/plans/recompute"
  mkdir -p "$P"
  OPTS="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
  SEQ=$(/usr/bin/python3 -c "import json; print(json.load(open('bench/gpu/configs/$CONFIG.json'))['seq_length'])")
  for mbs in $MBS $BIG; do
    "$BINDIR/mapp-translate" --import-gpt-config "bench/gpu/configs/$CONFIG.json" \
      --micro-batch-size "$mbs" -o "$P/model.mlir"
    policies="none selective full"
    [ "$mbs" = "$BIG" ] && policies="none full"
    for pol in $policies; do
      rc=()
      [ $pol = none ] || rc=("--mapp-recompute=policy=$pol layers=all")
      name="mbs$mbs.$pol"
      "$BINDIR/mapp-opt" "$P/model.mlir" -mapp-autodiff "${rc[@]}" "-mapp-optimizer=$OPTS" \
        -mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false \
        -o "$P/$name.mlir" 2> "$P/$name.remarks.txt"
      sed -n 's/.*memory plan, stage 0: peak [0-9]* B (\([0-9.]*\) MiB).* arena \([0-9]*\) B (.*; stash \([0-9]*\) B per.*/plan peak \1 MiB, arena \2 B, stash \3 B/p' \
        "$P/$name.remarks.txt" > "$P/$name.stats.txt"
      "$BINDIR/mapp-translate" --mapp-to-plan "$P/$name.mlir" -o "$P/$name.mplan"
      rm "$P/$name.mlir" "$P/$name.remarks.txt"
    done
    rm "$P/model.mlir"
  done
  echo "$CONFIG $MBS $BIG $SEQ" > "$P/meta.txt"
  cp bench/gpu/recompute.sh bench/gpu/runstats.py bench/gpu/common.sh "$OUTD/"
  exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-10}
BACKEND=${BACKEND:-cuda}
LOG=${OUT:-/tmp/mapp-recompute}
mkdir -p "$LOG"
export PYTHONPATH=$D${PYTHONPATH:+:$PYTHONPATH} # runstats.py
source "$D/common.sh"
if [ -n "${MAPP_RUN:-}" ]; then
  RUN=$MAPP_RUN
else
  unpack mapp-run
  RUN=$BIN/mapp-run
fi
P="$D/plans/recompute"
read -r CONFIG MBS BIG SEQ < "$P/meta.txt"

# runone NAME: trains plan NAME; its exit status.
runone() {
  echo "== $CONFIG $1 ($BACKEND)"
  timeout 540 "$RUN" "$P/$1.mplan" --backend=$BACKEND --data "$D/corpus.jsonl" \
    --tokenizer bytes --steps "$STEPS" --seed 11 --quiet --report-memory \
    --metrics "$LOG/$1.jsonl" > "$LOG/$1.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || tail -3 "$LOG/$1.log"
  return $rc
}

# report NAME MBS [BASE]: one summary line; non-zero when the loss differs.
report() {
  python3 - "$LOG" "$P" "$1" "$2" "$SEQ" "$BACKEND" "${3:-}" <<'PY'
import re, sys
from runstats import steps, median_step_ms, max_rel_loss_diff
log, plans, name, mbs, seq, backend, base = sys.argv[1:8]
m = steps(f"{log}/{name}.jsonl")
if not m:
    print(f"{name}: no metrics"); sys.exit(1)
t = open(f"{log}/{name}.log").read()
peak = re.findall(r"peak device memory ([0-9.]+) GiB", t)
alloc = re.findall(r"memory: allocated (\d+) B", t)
mem = f"peak {peak[-1]} GiB" if peak else (
    f"allocated {int(alloc[0]) / 2**20:.1f} MiB" if alloc else "peak ?")
stats = open(f"{plans}/{name}.stats.txt").read().strip() or "?"
ms = median_step_ms(m)
line = (f"{name}: {ms:.1f} ms/step, {int(mbs) * int(seq) * 1000 / ms:,.0f} tokens/s, "
        f"{mem} [{stats}]")
ok = True
if base:
    b = steps(f"{log}/{base}.jsonl")
    diff = max_rel_loss_diff(m, b) if b else float("inf")
    limit = 0.0 if backend == "cpu" else 1e-3
    ok = bool(b) and len(b) == len(m) and diff <= limit
    line += f"; max rel loss diff vs {base} {diff:.2e} {'ok' if ok else f'FAIL (> {limit:g})'}"
print(line)
sys.exit(0 if ok else 1)
PY
}

for pol in none selective full; do
  name="mbs$MBS.$pol"
  if runone $name; then
    base=""
    [ $pol = none ] || base="mbs$MBS.none"
    line=$(report $name $MBS $base)
    record "$line" $?
  else
    record "$name: mapp-run failed" 1
  fi
done

# The big micro-batch: only the recomputing plan fits.
name="mbs$BIG.none"
if runone $name; then
  if [ "$BACKEND" = cpu ]; then
    say "$(report $name $BIG) (dry run: fits on the host)"
  else
    record "$name: trained without recompute ($(report $name $BIG)): micro-batch $BIG does not need recompute here, raise BIG_MBS" 1
  fi
else
  reason=$(grep -m1 -io "out of [a-z ]*memory[^\"]*" "$LOG/$name.log" | head -c 160)
  if [ -n "$reason" ]; then
    say "$name: does not fit without recompute ($reason) [$(cat "$P/$name.stats.txt")]"
  else
    record "$name: mapp-run failed for another reason than memory (see $LOG/$name.log)" 1
  fi
fi
name="mbs$BIG.full"
if runone $name; then
  line=$(report $name $BIG)
  rc=$?
  [ "$BACKEND" = cpu ] || line="$line (fits only with recompute=full)"
  record "$line" $rc
else
  record "$name: mapp-run failed with full recompute" 1
fi
finish "recompute"

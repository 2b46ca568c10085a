#!/usr/bin/env bash
# MegaScope on the GPU (issue #8), on the GPU machine, from the folder
# bench/gpu/prepare.sh filled:
#   gpu/cuda/scope.sh [STEPS]        (SCOPE_13B=1 adds the 1.3B plan)
# 1. mapp-cuda-probe-test: every device reduction and perturbation vs the CPU
#    backend, and the capture ring's back-pressure.
# 2. e2e: one tiny plan with probes and a perturbation, 3 steps on cpu and on
#    cuda with the same seed: the stored statistics must agree.
# 3. --generate on cuda (same weights as a cpu generation; probes recorded).
# 4. Bench, 124M: no probes / 8 probes with reductions / the same 8 points
#    raw, interleaved twice; median step time after the warm-up steps;
#    overhead vs no probes (target <= 2%) and stored bytes (raw/reduced,
#    target >= 10x). Then, for information, the probe kernels' device time
#    per step (MAPP_CUDA_PROFILE) of a short reduced run.
# Logs in /tmp/mapp-scope (copied to $OUT when set); the summary is last.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-14}
SKIP=4
LOG=/tmp/mapp-scope
rm -rf $LOG && mkdir -p $LOG
export PYTHONUNBUFFERED=1
source "$D/common.sh"
unpack mapp-run mapp-cuda-probe-test
RUN=$BIN/mapp-run
ST="python3 $D/scope_stats.py"
FAILS=0
verdict() { # name rc text
  [ "$2" = 0 ] || FAILS=$((FAILS + 1))
  say "$([ "$2" = 0 ] && echo PASS || echo FAIL) $1: $3"
}

echo "== device probe/perturb kernels vs cpu"
timeout 180 $BIN/mapp-cuda-probe-test > $LOG/probe-test.log 2>&1
rc=$?
grep FAIL $LOG/probe-test.log | head -20
verdict "probe kernels" $rc "$(tail -1 $LOG/probe-test.log)"

echo "== e2e: same plan with probes, 3 steps, cpu vs cuda"
E2E=(--data "$D/corpus.jsonl" --tokenizer bytes --steps 3 --seed 11 --quiet)
$RUN "$D/plans/scope-e2e.mplan" --backend=cpu "${E2E[@]}" --probe-db $LOG/e2e-cpu.sqlite \
  --save $LOG/e2e.safetensors --metrics $LOG/e2e-cpu.jsonl > $LOG/e2e-cpu.log 2>&1 \
  && $RUN "$D/plans/scope-e2e.mplan" --backend=cuda "${E2E[@]}" --probe-db $LOG/e2e-cuda.sqlite \
  --metrics $LOG/e2e-cuda.jsonl > $LOG/e2e-cuda.log 2>&1
rc=$?
if [ $rc = 0 ]; then
  out=$($ST compare $LOG/e2e-cpu.sqlite $LOG/e2e-cuda.sqlite); rc=$?
  echo "$out"
  verdict "e2e stored statistics" $rc "$(echo "$out" | head -1)"
else
  tail -5 $LOG/e2e-*.log
  verdict "e2e stored statistics" 1 "mapp-run failed"
fi

echo "== --generate on cuda"
GEN=(--generate --prompt "The market" --max-new-tokens 8 --greedy --tokenizer bytes
     --weights $LOG/e2e.safetensors --quiet)
$RUN "$D/plans/scope-e2e.mplan" --backend=cpu "${GEN[@]}" --generate-out $LOG/gen-cpu.jsonl \
  > $LOG/gen-cpu.log 2>&1 \
  && $RUN "$D/plans/scope-e2e.mplan" --backend=cuda "${GEN[@]}" --generate-out $LOG/gen-cuda.jsonl \
  --probe-db $LOG/gen-cuda.sqlite > $LOG/gen-cuda.log 2>&1
rc=$?
if [ $rc = 0 ]; then
  out=$($ST generate $LOG/gen-cpu.jsonl $LOG/gen-cuda.jsonl $LOG/gen-cuda.sqlite); rc=$?
  verdict "generate" $rc "$out"
else
  tail -5 $LOG/gen-*.log
  verdict "generate" 1 "mapp-run failed"
fi

bench() { # model steps
  local m=$1 n=$2
  echo "== bench $m: $n steps per run, none/reduced/raw interleaved x2"
  declare -A ms
  for rep in 1 2; do
    for mode in none reduced raw; do
      local plan="$D/plans/scope-$m-$mode.mplan" db=$LOG/$m-$mode.sqlite
      [ $mode = none ] && plan="$D/plans/gpt-$m.mplan"
      rm -f $db $db-wal $db-shm
      local extra=()
      [ $mode != none ] && extra=(--probe-db $db)
      # Raw captures of 25-130 MB per point: a ring that holds a few.
      [ $mode = raw ] && export MAPP_PROBE_RING_BYTES=$((1 << 30))
      $RUN "$plan" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes \
        --steps $n --quiet --metrics $LOG/$m-$mode-$rep.jsonl "${extra[@]}" \
        > $LOG/$m-$mode-$rep.log 2>&1 || { tail -3 $LOG/$m-$mode-$rep.log; }
      unset MAPP_PROBE_RING_BYTES
      ms[$mode]="${ms[$mode]:-} $($ST steptime $LOG/$m-$mode-$rep.jsonl $SKIP 2>/dev/null || echo nan)"
    done
  done
  local red raw
  red=$($ST bytes $LOG/$m-reduced.sqlite 2>/dev/null)
  raw=$($ST bytes $LOG/$m-raw.sqlite 2>/dev/null)
  python3 - "$m" "${ms[none]}" "${ms[reduced]}" "${ms[raw]}" "$red" "$raw" <<'EOF' > $LOG/$m-bench.txt
import json, math, statistics, sys
m, none, red, raw = sys.argv[1], *[[float(x) for x in a.split()] for a in sys.argv[2:5]]
try:
    rb, wb = json.loads(sys.argv[5]), json.loads(sys.argv[6])
except ValueError:
    rb = wb = {"sample_bytes": float("nan"), "file_bytes": float("nan")}
t0, tr, tw = (statistics.mean(x) if x else math.nan for x in (none, red, raw))
ovr, ovw = 100 * (tr / t0 - 1), 100 * (tw / t0 - 1)
ratio = wb["sample_bytes"] / rb["sample_bytes"] if rb["sample_bytes"] else math.nan
ok = ovr <= 2.0 and ratio >= 10
print("%s %s: step ms none %.1f (%s) | 8 probes reduced %.1f (%+.2f%%) | "
      "raw %.1f (%+.1f%%) | stored bytes reduced %.0f (file %.0f) raw %.0f (file %.0f) "
      "raw/reduced %.0fx" % ("PASS" if ok else "FAIL", m, t0,
      "/".join("%.1f" % x for x in none), tr, ovr, tw, ovw, rb["sample_bytes"],
      rb["file_bytes"], wb["sample_bytes"], wb["file_bytes"], ratio))
EOF
  local line; line=$(cat $LOG/$m-bench.txt)
  [[ $line == PASS* ]] || FAILS=$((FAILS + 1))
  say "bench $line"
  rm -f $LOG/$m-raw.sqlite*
}
bench 124m "$STEPS"

# Device time of the probe kernels alone (informational): CUDA events
# around every kernel call of a short reduced run (MAPP_CUDA_PROFILE).
echo "== probe device time, 124m reduced (MAPP_CUDA_PROFILE=1)"
rm -f $LOG/124m-prof.sqlite*
MAPP_CUDA_PROFILE=1 $RUN "$D/plans/scope-124m-reduced.mplan" --backend=cuda \
  --data "$D/corpus.jsonl" --tokenizer bytes --steps 6 --quiet \
  --probe-db $LOG/124m-prof.sqlite > $LOG/124m-profile.log 2>&1
prof=$(awk '$1 == "probe" {printf "%s ms/step in %s calls/step", $2, $5}' $LOG/124m-profile.log)
say "info probe kernels 124m: ${prof:-no probe line (see 124m-profile.log)}; $(grep -m1 'mapp cuda profile' $LOG/124m-profile.log)"
[ "${SCOPE_13B:-0}" = 1 ] && bench 1.3b 8

if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/scope-logs.tgz" -C $LOG $(cd $LOG && ls *.log *.txt *.jsonl 2>/dev/null)
fi
echo
echo "================ scope summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null))"
printf '%s\n' "${SUMMARY[@]}"
[ $FAILS = 0 ] && echo "scope: PASS" || echo "scope: FAIL ($FAILS)"
exit $((FAILS > 0))

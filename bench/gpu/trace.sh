#!/usr/bin/env bash
# MegaScan on the CUDA backend (issue #7): the gpu-labelled trace test and the
# cost of one mark; the overhead of op-level tracing on the 124M and 1.3B
# bench plans; mapp-scan on a traced run. Runs from the folder
# bench/gpu/prepare.sh filled (it copies this script there):
#   gpu/cuda/trace.sh [ROUNDS] [STEPS_124M] [STEPS_1B3]
# Overhead: the plan compiled with --mapp-insert-trace=granularity=op run
#   A  with --trace-dir (every step traced: CUDA events, resolved after the step)
#   B  without --trace-dir (the trace instrs are compiled in and skipped)
#   C  the plan compiled without trace instrs
# interleaved A B C, A B C, ... (ROUNDS rounds); per run the median step_ms of
# --metrics after WARM warm-up steps; overhead = median over rounds of
# A/B - 1 (and B/C - 1), spread = min..max over rounds. Goal: A/B <= 0.5%.
# Logs and traces in /tmp/mapp-trace-log; summary at the end.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${1:-3}
S124=${2:-60}
S13=${3:-10}
WARM=${WARM:-3}
LOG=/tmp/mapp-trace-log
rm -rf $LOG && mkdir -p $LOG
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# Own folder: gpu.sh's /tmp/mapp-cuda-bin may hold binaries of another build.
BIN=/tmp/mapp-trace-bin
rm -rf $BIN && mkdir -p $BIN
for b in mapp-run mapp-scan mapp-cuda-trace-test; do
  xz -dc "$D/bin/$b.xz" > $BIN/$b && chmod +x $BIN/$b
done
SUMMARY=()
say() { echo "$*"; SUMMARY+=("$*"); }
T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader

echo "== trace test (gpu label) + mark cost [$((SECONDS - T0)) s]"
timeout 120 $BIN/mapp-cuda-trace-test --bench > $LOG/trace-test.log 2>&1
rc=$?
cat $LOG/trace-test.log
say "cuda trace test: $(tail -1 $LOG/trace-test.log) rc=$rc"
say "mark cost:$(grep -o 'per mark:.*' $LOG/trace-test.log | head -1)"

run() { # plan trace(0|1) steps metrics [tracedir]
  local extra=()
  [ -n "${5:-}" ] && extra=(--trace-dir "$5")
  $BIN/mapp-run "$1" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes \
    --steps "$3" --metrics "$4" --quiet "${extra[@]}" > "$4.log" 2>&1 \
    || { echo "mapp-run failed: $1 $*"; tail -3 "$4.log"; }
}

for c in gpt-124m gpt-1.3b; do
  steps=$S124; [ $c = gpt-1.3b ] && steps=$S13
  echo "== $c: $ROUNDS rounds of A (traced) B (trace off) C (no-trace plan), $steps steps [$((SECONDS - T0)) s]"
  for i in $(seq "$ROUNDS"); do
    run "$D/plans/$c.traced.mplan" 1 "$steps" "$LOG/$c.A.$i.jsonl" "$LOG/tr-$c-$i"
    run "$D/plans/$c.traced.mplan" 0 "$steps" "$LOG/$c.B.$i.jsonl"
    run "$D/plans/$c.mplan" 0 "$steps" "$LOG/$c.C.$i.jsonl"
  done
  say "$(python3 - "$LOG" "$c" "$ROUNDS" "$WARM" <<'PY'
import json, statistics, sys
log, c, rounds, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def med(v, i):
    try:
        m = [json.loads(l) for l in open(f"{log}/{c}.{v}.{i}.jsonl")]
    except OSError:
        return None
    m = [x["step_ms"] for x in m[warm:]]
    return statistics.median(m) if m else None
ab, bc, ms = [], [], {"A": [], "B": [], "C": []}
for i in range(1, rounds + 1):
    a, b, cc = med("A", i), med("B", i), med("C", i)
    for k, v in (("A", a), ("B", b), ("C", cc)):
        if v: ms[k].append(v)
    if a and b: ab.append(100 * (a / b - 1))
    if b and cc: bc.append(100 * (b / cc - 1))
if not ab:
    print(f"overhead {c}: FAIL (no runs)")
    sys.exit()
ok = statistics.median(ab) <= 0.5
print(f"overhead {c}: traced vs off {statistics.median(ab):+.2f}% "
      f"(rounds {min(ab):+.2f}..{max(ab):+.2f}), off vs no-trace plan "
      f"{statistics.median(bc) if bc else float('nan'):+.2f}%; step ms "
      f"A {statistics.median(ms['A']):.2f} B {statistics.median(ms['B']):.2f} "
      f"C {statistics.median(ms['C']) if ms['C'] else float('nan'):.2f}; "
      f"goal <=0.5%: {'PASS' if ok else 'FAIL'}")
PY
)"
done

for c in gpt-124m gpt-1.3b; do
  d=$LOG/tr-$c-$ROUNDS
  echo "== mapp-scan $d [$((SECONDS - T0)) s]"
  timeout 120 $BIN/mapp-scan "$d" -o "$LOG/$c.merged.json" --report "$LOG/$c.report.json" \
    > "$LOG/$c.scan.log" 2>&1 || { tail -5 "$LOG/$c.scan.log"; say "scan $c: mapp-scan FAILED"; continue; }
  head -3 "$LOG/$c.scan.log"
  say "$(python3 - "$d" "$LOG/$c.A.$ROUNDS.jsonl" "$LOG/$c.merged.json" "$WARM" "$c" <<'PY'
import json, statistics, sys
d, metrics, merged, warm, c = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
recs = [json.loads(l) for l in open(f"{d}/rank-0.trace.jsonl")]
ev = [r for r in recs if "type" not in r]
hdr, foot = recs[0], recs[-1]
neg = sum(e["e"] < e["b"] for e in ev)
zero = sum(e["e"] == e["b"] for e in ev)
# Stream regions: everything but the executor's wrappers and host work.
host = ("data",)
ops = [e for e in ev if e["cat"] not in host and e["name"] not in ("optimizer", "step.metrics")]
steps = {}
for e in ops:
    steps.setdefault(e["step"], []).append(e)
disorder = 0
for s, es in steps.items():  # file order = issue order on the stream
    disorder += sum(es[i]["b"] < es[i - 1]["e"] for i in range(1, len(es)))
step_ms = {m["step"]: m["step_ms"] for m in map(json.loads, open(metrics))}
ratios = []
for s, es in sorted(steps.items()):
    if s < warm or s not in step_ms:
        continue
    busy = sum(e["e"] - e["b"] for e in es) / 1e6
    ratios.append(busy / step_ms[s])
comp = []
for s, es in sorted(steps.items()):
    if s >= warm and s in step_ms:
        comp.append(sum(e["e"] - e["b"] for e in es if e["cat"] == "compute") / 1e6 / step_ms[s])
ch = json.load(open(merged))
xs = [e for e in (ch["traceEvents"] if isinstance(ch, dict) else ch) if e.get("ph") == "X"]
negdur = sum(e["dur"] < 0 for e in xs)
ok = (neg == 0 and negdur == 0 and disorder == 0 and foot.get("dropped", 1) == 0
      and ratios and 0.5 < statistics.median(ratios) <= 1.001 and len(xs) >= len(ev) * 0.99)
print(f"scan {c}: {len(ev)} events, device {hdr.get('device')}, e<b {neg}, e==b {zero}, "
      f"stream order violations {disorder}, dropped {foot.get('dropped')}; per-step "
      f"stream busy / step_ms median {statistics.median(ratios) if ratios else float('nan'):.3f} "
      f"({min(ratios or [0]):.3f}..{max(ratios or [0]):.3f}), compute only "
      f"{statistics.median(comp) if comp else float('nan'):.3f}; chrome {len(xs)} X events, "
      f"dur<0 {negdur}: {'PASS' if ok else 'FAIL'}")
PY
)"
done

echo
echo "================ trace summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader), $((SECONDS - T0)) s)"
printf '%s\n' "${SUMMARY[@]}"
if [ -n "${OUT:-}" ]; then
  printf '%s\n' "${SUMMARY[@]}" > "$OUT/trace-summary.txt"
  cp $LOG/trace-test.log "$OUT/" 2>/dev/null
  cat $LOG/*.A.*.jsonl > "$OUT/trace-A-metrics.jsonl" 2>/dev/null
fi

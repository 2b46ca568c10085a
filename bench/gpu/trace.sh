#!/usr/bin/env bash
# MegaScan on the CUDA backend (issue #7): the gpu-labelled trace test and the
# cost of one mark; the overhead of op-level tracing on the 124M and 1.3B
# bench plans; mapp-scan on the traced runs. Runs from the folder
# bench/gpu/prepare.sh filled (it copies this script there):
#   gpu/cuda/trace.sh [PERIODS_124M] [PERIODS_1B3] [ROUNDS_124M]
# Overhead, per model (median step_ms from --metrics):
#   S  the plan compiled with --mapp-insert-trace=granularity=op, one run,
#      --trace-dir --trace-sample 6:3: steps alternate 3 traced (CUDA events,
#      resolved after each step on a resolver thread), 3 not traced (the
#      trace instrs are skipped). Steady steps only: a traced step after a
#      traced one (it also carries its predecessor's resolution) vs an
#      untraced step after an untraced one. Per 6-step period one ratio
#      (drift cancels); overhead = median over periods, spread = min..max.
#      The first period (warm-up) is dropped.
#   C  the plan compiled without trace instrs, a separate run: the cost of
#      the compiled-in trace instrs when recording is off, and S-traced vs C.
# Runs S C S C ... (ROUNDS_124M rounds for 124M, one for 1.3B: its host-side
# parameter init takes tens of seconds). Goal: traced vs untraced <= 0.5%.
# Logs and traces in /tmp/mapp-trace-log; summary at the end.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
P124=${1:-8}
P13=${2:-4}
R124=${3:-3}
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

run() { # plan steps metrics [tracedir]
  local extra=()
  [ -n "${4:-}" ] && extra=(--trace-dir "$4" --trace-sample 6:3)
  $BIN/mapp-run "$1" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes \
    --steps "$2" --metrics "$3" --quiet "${extra[@]}" > "$3.log" 2>&1 \
    || { echo "mapp-run failed: $*"; tail -3 "$3.log"; }
}

for c in gpt-124m gpt-1.3b; do
  periods=$P124 rounds=$R124
  [ $c = gpt-1.3b ] && periods=$P13 rounds=1
  steps=$((6 * (periods + 1)))
  echo "== $c: $rounds round(s) of S (traced plan, 6:3 sampling) and C (no-trace plan), $steps steps [$((SECONDS - T0)) s]"
  for i in $(seq "$rounds"); do
    run "$D/plans/$c.traced.mplan" "$steps" "$LOG/$c.S.$i.jsonl" "$LOG/tr-$c-$i"
    run "$D/plans/$c.mplan" "$steps" "$LOG/$c.C.$i.jsonl"
  done
  say "$(python3 - "$LOG" "$c" "$rounds" <<'PY'
import json, statistics as st, sys
log, c, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(v, i):
    try:
        return {m["step"]: m["step_ms"] for m in map(json.loads, open(f"{log}/{c}.{v}.{i}.jsonl"))}
    except OSError:
        return {}
per, on_all, off_all, cms = [], [], [], []
for i in range(1, rounds + 1):
    s = load("S", i)
    for p0 in range(6, max(s, default=0) + 1, 6):
        on = [s[k] for k in (p0 + 1, p0 + 2) if k in s]
        off = [s[k] for k in (p0 + 4, p0 + 5) if k in s]
        if on and off:
            per.append(100 * (st.mean(on) / st.mean(off) - 1))
            on_all += on
            off_all += off
    cc = load("C", i)
    cms += [v for k, v in cc.items() if k >= 6]
if not per:
    print(f"overhead {c}: FAIL (no steady periods; see {log}/{c}.S.1.jsonl.log)")
    sys.exit()
med = st.median(per)
on_m, off_m = st.median(on_all), st.median(off_all)
c_m = st.median(cms) if cms else float("nan")
print(f"overhead {c}: traced vs untraced steps, same run {med:+.2f}% "
      f"(periods {len(per)}: {min(per):+.2f}..{max(per):+.2f}); step ms traced "
      f"{on_m:.2f} untraced {off_m:.2f} no-trace plan {c_m:.2f} (untraced vs "
      f"no-trace plan {100 * (off_m / c_m - 1):+.2f}%, traced vs no-trace plan "
      f"{100 * (on_m / c_m - 1):+.2f}%); goal <=0.5%: {'PASS' if med <= 0.5 else 'FAIL'}")
PY
)"
done

for c in gpt-124m gpt-1.3b; do
  d=$LOG/tr-$c-1
  echo "== mapp-scan $d [$((SECONDS - T0)) s]"
  timeout 120 $BIN/mapp-scan "$d" -o "$LOG/$c.merged.json" --report "$LOG/$c.report.json" \
    > "$LOG/$c.scan.log" 2>&1 || { tail -5 "$LOG/$c.scan.log"; say "scan $c: mapp-scan FAILED"; continue; }
  head -3 "$LOG/$c.scan.log"
  say "$(python3 - "$d" "$LOG/$c.S.1.jsonl" "$LOG/$c.merged.json" 6 "$c" <<'PY'
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
  for f in $LOG/*.S.*.jsonl $LOG/*.C.*.jsonl; do
    sed "s/^{/{\"run\":\"$(basename $f .jsonl)\",/" "$f"
  done > "$OUT/trace-metrics.jsonl" 2>/dev/null
fi

#!/usr/bin/env bash
# MegaScan tracing overhead on CPU: the tiny GPT (examples/gpt-tiny.json)
# compiled three ways — no trace instrs, --mapp-insert-trace (layer
# granularity), --mapp-insert-trace=granularity=op — trained alternately
# R times for STEPS steps each; prints the median step time of each variant.
# Usage (repo root): bench/trace-overhead.sh   (writes into out/trace-bench)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-$ROOT/build/bin}; D=${D:-$ROOT/data/gpt/news-1k.jsonl}; R=${R:-5}; STEPS=${STEPS:-60}
OUT=${OUT:-$ROOT/out/trace-bench}; mkdir -p "$OUT"; cd "$OUT"
$B/mapp-translate --import-gpt-config "$ROOT/examples/gpt-tiny.json" -o model.mlir
opt() { $B/mapp-opt model.mlir -mapp-autodiff -mapp-optimizer="lr=1e-3" "$@" \
          -mapp-plan-memory -mapp-lower-to-plan -o step.mlir 2>/dev/null; }
opt && $B/mapp-translate --mapp-to-plan step.mlir -o plain.mplan
opt -mapp-insert-trace && $B/mapp-translate --mapp-to-plan step.mlir -o traced.mplan
opt -mapp-insert-trace="granularity=op" && $B/mapp-translate --mapp-to-plan step.mlir -o tracedop.mplan
for i in $(seq $R); do
  for p in plain traced tracedop; do
    extra=""; [ $p != plain ] && extra="--trace-dir tr-$p"
    rm -rf tr-$p
    $B/mapp-run $p.mplan --data $D --tokenizer bytes --steps $STEPS --quiet --threads 1 --metrics m-$p-$i.jsonl $extra
  done
done
python3 - "$R" <<'PY'
import json, statistics, sys
R = int(sys.argv[1])
for p in ("plain", "traced", "tracedop"):
    meds = []
    for i in range(1, R + 1):
        m = [json.loads(l) for l in open(f"m-{p}-{i}.jsonl")][10:]
        meds.append(statistics.median(x["step_ms"] for x in m))
    print(f"{p:9s} median step_ms over runs {statistics.median(meds):.3f}  ({1000/statistics.median(meds):.1f} steps/s)  runs {[round(x,2) for x in meds]}")
PY

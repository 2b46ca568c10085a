#!/usr/bin/env bash
# MegaScan live on the H200 (issue #23): NVML fields in the summaries, and
# the monitor's cost at the 1.3B config, on vs off in one invocation.
#   test/gpu/monitor.sh PLAN.mplan [STEPS]     env: BIN (build/bin), DATA, TOKENIZER, PAIRS (3)
# PLAN: the 1.3B plan the GPU benchmarks use (bench/gpu/, docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
PLAN=$1
STEPS=${2:-30}
DATA=${DATA:-data/gpt/news-1k.jsonl}
TOK=${TOKENIZER:-gpt2:data/gpt/gpt2-vocab.json,data/gpt/gpt2-merges.txt}
W=$(mktemp -d)
run() {
  "$BIN/mapp-run" "$PLAN" --backend=cuda --data "$DATA" --tokenizer "$TOK" \
    --steps "$STEPS" --quiet --metrics "$W/m-$1.jsonl" "${@:2}" 2> "$W/err-$1.txt" ||
    { echo "FAIL: run $1: $(tail -3 "$W/err-$1.txt")"; exit 1; }
}
mean() { /usr/bin/python3 -c "import json,sys; v=[json.loads(l)['step_ms'] for l in open(sys.argv[1])][3:]; print(sum(v)/len(v))" "$1"; }
PAIRS=${PAIRS:-3}
# Alternated off/on pairs in one invocation; the median pair decides.
for k in $(seq 1 "$PAIRS"); do run off$k; run on$k --monitor "$W/a$k.jsonl"; done
grep 'monitor:' "$W/err-on1.txt" || true
grep -q 'GPU signals in' "$W/err-on1.txt" || { echo "FAIL: no NVML fields in the summaries"; exit 1; }
ratios=()
for k in $(seq 1 "$PAIRS"); do
  off=$(mean "$W/m-off$k.jsonl"); on=$(mean "$W/m-on$k.jsonl")
  r=$(/usr/bin/python3 -c "print($on/$off)")
  ratios+=("$r")
  echo "pair $k: off $off ms/step, on $on ms/step, overhead $(/usr/bin/python3 -c "print(f'{100*($r-1):+.2f}%')")"
done
/usr/bin/python3 -c "import statistics,sys; m=statistics.median(map(float,sys.argv[1:])); print(f'median overhead {100*(m-1):+.2f}% over {len(sys.argv)-1} pairs (goal <= 0.5%)')" "${ratios[@]}"
echo "alerts (a clean run should have none):"; cat "$W"/a*.jsonl

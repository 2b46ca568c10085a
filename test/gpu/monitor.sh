#!/usr/bin/env bash
# MegaScan live on the H200 (issue #23): NVML fields in the summaries, and
# the monitor's cost at the 1.3B config, on vs off in one invocation.
#   test/gpu/monitor.sh PLAN.mplan [STEPS]     env: BIN (build/bin), DATA, TOKENIZER
# PLAN: the 1.3B plan the GPU benchmarks use (bench/gpu/, docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
PLAN=$1
STEPS=${2:-30}
DATA=${DATA:-data/gpt/news-1k.jsonl}
TOK=${TOKENIZER:-gpt2:data/gpt/gpt2-vocab.json,data/gpt/gpt2-merges.txt}
W=$(mktemp -d)
run() { "$BIN/mapp-run" "$PLAN" --backend=cuda --data "$DATA" --tokenizer "$TOK" \
          --steps "$STEPS" --quiet --metrics "$W/m-$1.jsonl" "${@:2}" 2> "$W/err-$1.txt"; }
mean() { /usr/bin/python3 -c "import json,sys; v=[json.loads(l)['step_ms'] for l in open(sys.argv[1])][3:]; print(sum(v)/len(v))" "$1"; }
run off1; run on1 --monitor "$W/a1.jsonl"; run off2; run on2 --monitor "$W/a2.jsonl"
grep 'monitor:' "$W/err-on1.txt" || true
grep -q 'GPU signals in' "$W/err-on1.txt" || { echo "FAIL: no NVML fields in the summaries"; exit 1; }
for k in 1 2; do
  off=$(mean "$W/m-off$k.jsonl"); on=$(mean "$W/m-on$k.jsonl")
  echo "pair $k: off $off ms/step, on $on ms/step, overhead $(/usr/bin/python3 -c "print(f'{100*($on/$off-1):+.2f}%')") (goal <= 0.5%)"
done
echo "alerts (a clean run should have none):"; cat "$W/a1.jsonl" "$W/a2.jsonl"

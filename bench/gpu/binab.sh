#!/usr/bin/env bash
# Two mapp-run binaries on one plan, alternated in one invocation (A B A B
# ...), for "does not regress" checks of a runtime change on the GPU:
#   bench/gpu/binab.sh A_RUN B_RUN PLAN [STEPS] [PAIRS]
# env: DATA (corpus), TOKENIZER (bytes), BACKEND (cuda). Prints each run's
# mean ms/step after 3 warm-up steps, each pair's B/A ratio, their median,
# and whether the final losses agree (same plan, data and seed: they must,
# up to the atomics' run-to-run noise on CUDA).
set -uo pipefail
A=$1 B=$2 PLAN=$3 STEPS=${4:-15} PAIRS=${5:-3}
DATA=${DATA:-data/gpt/news-1k.jsonl}
TOK=${TOKENIZER:-bytes}
W=$(mktemp -d)
run() { # BIN TAG
  "$1" "$PLAN" --backend="${BACKEND:-cuda}" --data "$DATA" --tokenizer "$TOK" \
    --steps "$STEPS" --seed 11 --quiet --metrics "$W/$2.jsonl" 2> "$W/$2.err" ||
    { echo "$2: mapp-run failed: $(tail -2 "$W/$2.err")"; return 1; }
}
stat() { # TAG -> "mean_ms last_loss"
  python3 -c "import json,sys; m=[json.loads(l) for l in open(sys.argv[1])]; v=[x['step_ms'] for x in m][3:]; print(sum(v)/len(v), m[-1]['loss'])" "$W/$1.jsonl"
}
ratios=()
for k in $(seq 1 "$PAIRS"); do
  run "$A" a$k && run "$B" b$k || exit 1
  read -r ta la <<< "$(stat a$k)"; read -r tb lb <<< "$(stat b$k)"
  r=$(python3 -c "print($tb/$ta)")
  ratios+=("$r")
  printf 'pair %d: A %.1f ms/step (loss %.5f), B %.1f ms/step (loss %.5f), B/A %.4f\n' \
    "$k" "$ta" "$la" "$tb" "$lb" "$r"
done
python3 -c "import statistics,sys; m=statistics.median(map(float,sys.argv[1:])); print(f'median B/A {m:.4f} ({100*(m-1):+.2f}%) over {len(sys.argv)-1} pairs')" "${ratios[@]}"

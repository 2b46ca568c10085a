#!/usr/bin/env bash
# Step time of mapp-run (CPU backend) against PyTorch on CPU (Debian's torch
# 1.13 through /usr/bin/python3), same model, same thread count, AdamW.
#
#   bench/cpu/compare.sh [CONFIG.json ...]
#   env: THREADS (default 2), STEPS (default 20), REPEAT (default 3),
#        BIN (default build/bin)
#
# Prints one row per config: median step time of each (the first two steps
# are warm-up and not counted), the ratio mapp/torch and the tokens/s. Each
# side runs REPEAT times, alternating, and the best median counts: on a
# shared machine other processes only ever add time.
# mapp's step time is mapp-run's own step_ms (the executor's step: data,
# forward, backward, optimizer); PyTorch's is zero_grad+forward+backward+step.
# OMP_WAIT_POLICY defaults to PASSIVE for PyTorch: on a shared, oversubscribed
# machine OpenMP's spinning threads make torch up to 10x slower (measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${THREADS:-2}
STEPS=${STEPS:-20}
REPEAT=${REPEAT:-3}
BIN=${BIN:-build/bin}
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(examples/gpt-tiny.json bench/cpu/gpt-4l-256.json)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

median() { /usr/bin/python3 -c 'import json,statistics,sys; v=json.load(sys.stdin)[2:]; print(f"{statistics.median(v):.2f}")'; }

printf '%-28s %8s %8s %8s %9s %12s %12s\n' config threads "mapp ms" "torch ms" "mapp/torch" "mapp tok/s" "torch tok/s"
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .json)
  "$BIN/mapp-translate" --import-gpt-config "$cfg" |
    "$BIN/mapp-opt" -mapp-autodiff -mapp-optimizer -mapp-plan-memory 2>/dev/null |
    "$BIN/mapp-translate" --mapp-to-plan -o "$work/$name.mplan"
  mapp_ms= torch_ms=
  for _ in $(seq "$REPEAT"); do
    "$BIN/mapp-run" "$work/$name.mplan" --data data/gpt/news-1k.jsonl --tokenizer bytes \
      --threads "$THREADS" --steps "$STEPS" --quiet --metrics "$work/$name.metrics.jsonl"
    m=$(/usr/bin/python3 -c 'import json,sys; print(json.dumps([json.loads(l)["step_ms"] for l in open(sys.argv[1])]))' \
      "$work/$name.metrics.jsonl" | median)
    t=$(OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} /usr/bin/python3 bench/cpu/torch_step.py "$cfg" --threads "$THREADS" --steps "$STEPS" |
      /usr/bin/python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["step_ms"]))' | median)
    mapp_ms=$(/usr/bin/python3 -c "print(min(float('$m'), float('${mapp_ms:-inf}')))")
    torch_ms=$(/usr/bin/python3 -c "print(min(float('$t'), float('${torch_ms:-inf}')))")
  done
  tokens=$(/usr/bin/python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c["micro_batch_size"]*c["seq_length"])' "$cfg")
  /usr/bin/python3 - "$name" "$THREADS" "$mapp_ms" "$torch_ms" "$tokens" <<'PY'
import sys
name, th, m, t, tok = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
print(f"{name:<28} {th:>8} {m:>8.2f} {t:>8.2f} {m / t:>9.2f}x {tok / m * 1e3:>12.0f} {tok / t * 1e3:>12.0f}")
PY
done

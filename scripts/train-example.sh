#!/usr/bin/env bash
# The main job: compile the example GPT and train it — on CPU unless a GPU is
# present. Installs what is missing, builds, then:
#   GPT config --mapp-translate--> forward graph --mapp-opt--> training step
#   --mapp-translate--> plan --mapp-run--> loss log, metrics, checkpoint.
# Usage: scripts/train-example.sh [CONFIG.json] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/gpt-small.json}
STEPS=${2:-40}
OUT=${MAPP_OUT:-out/example}

scripts/setup.sh
scripts/build.sh >/dev/null
BIN=build/bin
mkdir -p "$OUT"

BACKEND=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$BIN/mapp-run" --help 2>&1 | grep -q "cuda"; then
  BACKEND=cuda
fi

echo "== compile $CONFIG"
"$BIN/mapp-translate" --import-gpt-config "$CONFIG" -o "$OUT/model.mlir"
"$BIN/mapp-opt" "$OUT/model.mlir" -mapp-autodiff \
  -mapp-optimizer="lr=6e-4 weight-decay=0.1 beta2=0.95 max-grad-norm=1.0 lr-schedule=cosine warmup=10 total-steps=$STEPS min-lr=6e-5" \
  -mapp-plan-memory -mapp-lower-to-plan -o "$OUT/train.mlir"
"$BIN/mapp-translate" --mapp-to-plan "$OUT/train.mlir" -o "$OUT/model.mplan"

echo "== train on $BACKEND for $STEPS steps"
"$BIN/mapp-run" "$OUT/model.mplan" --backend="$BACKEND" \
  --data data/gpt/news-1k.jsonl \
  --tokenizer gpt2:data/gpt/gpt2-vocab.json,data/gpt/gpt2-merges.txt \
  --steps "$STEPS" --seed 1 --metrics "$OUT/metrics.jsonl" \
  --save "$OUT/final.safetensors"
echo "== metrics in $OUT/metrics.jsonl, weights in $OUT/final.safetensors"

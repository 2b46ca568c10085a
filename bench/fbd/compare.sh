#!/usr/bin/env bash
# MegaFBD on CPU ranks, side by side: unsplit tp=2 against split layouts
# (fwd-tp=1/bwd-tp=2 recompute, fwd-tp=2/bwd-tp=2 activations and
# recompute), and the coordinator on vs off. One mapp-run per layout,
# --comm=local with one thread per rank; prints mean step_ms over steps
# 3..STEPS and the final loss. Usage: bench/fbd/compare.sh [BUILD] [STEPS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build}/bin
STEPS=${2:-20}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CFG='{"variant":"gpt","num_layers":4,"hidden_size":128,"num_attention_heads":4,"seq_length":64,"vocab_size":256,"micro_batch_size":4,"tie_embeddings":true}'
echo "$CFG" > "$T/cfg.json"
PYTHONPATH=$ROOT/python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
  --config "$T/cfg.json" -o "$T/model.mlir" --weights "$T/init.safetensors" --seed 7 >/dev/null
OPT="optimizer=adamw lr=0.003 microbatches=4 schedule=1f1b"
plan() { # name pipeline-options
  "$BIN/mapp-opt" "$T/model.mlir" --mapp-train-pipeline="$2 $OPT" -o "$T/$1.mlir" 2>/dev/null
  "$BIN/mapp-translate" --mapp-to-plan "$T/$1.mlir" -o "$T/$1.mplan"
}
run() { # name extra-flags...
  local name=$1; shift
  "$BIN/mapp-run" "$T/$name.mplan" --data "$ROOT/data/gpt/news-1k.jsonl" --tokenizer bytes \
    --steps "$STEPS" --seed 11 --weights "$T/init.safetensors" --threads 1 --comm=local \
    --metrics "$T/m.jsonl" --quiet "$@" >/dev/null
  /usr/bin/python3 - "$T/m.jsonl" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
ms = [x["step_ms"] for x in m[2:]]
print(f"{sum(ms)/len(ms):9.1f} ms/step   final loss {m[-1]['loss']:.6f}")
PY
}
plan tp2pp2 "tp=2 pp=2"
plan f1b2rec "tp=2 pp=2 fbd=true fwd-tp=1 transfer=recompute"
plan f2b2rec "tp=2 pp=2 fbd=true fwd-tp=2 transfer=recompute"
plan f2b2act "tp=2 pp=2 fbd=true fwd-tp=2 transfer=activations"
printf '%-44s' "unsplit tp=2 pp=2 (4 ranks)";                 run tp2pp2
printf '%-44s' "fbd fwd-tp=1 bwd-tp=2 recompute (6 ranks)";   run f1b2rec
printf '%-44s' "fbd fwd-tp=2 bwd-tp=2 recompute (8 ranks)";   run f2b2rec
printf '%-44s' "fbd fwd-tp=2 bwd-tp=2 activations (8 ranks)"; run f2b2act
printf '%-44s' "  same, --coordinator=off";                   run f2b2act --coordinator=off
printf '%-44s' "fbd fwd-tp=1 recompute, --coordinator=off";   run f1b2rec --coordinator=off

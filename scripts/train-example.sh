#!/usr/bin/env bash
# The main job: compile the example GPT and train it — on CPU unless a GPU is
# present. Installs what is missing, builds, then:
#   GPT config --mapp-translate--> forward graph --mapp-opt--> training step
#   --mapp-translate--> plan --mapp-run--> loss log, metrics, checkpoint.
# Tracing (MegaScan) and probes (MegaScope, examples/probes.json) are on.
# Usage: scripts/train-example.sh [CONFIG.json] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/gpt-small.json}
STEPS=${2:-40}
OUT=${MAPP_OUT:-out/example}

source scripts/progress.sh
announce "setup: Debian packages (installs only what is missing)"
scripts/setup.sh
scripts/build.sh
BIN=build/bin
mkdir -p "$OUT"

BACKEND=cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
   "$BIN/mapp-run" --help 2>&1 | grep -q "cuda"; then
  BACKEND=cuda
fi

announce "compile $CONFIG"
"$BIN/mapp-translate" --import-gpt-config "$CONFIG" -o "$OUT/model.mlir"
with_heartbeat compile "$BIN/mapp-opt" "$OUT/model.mlir" -mapp-autodiff \
  -mapp-optimizer="lr=6e-4 weight-decay=0.1 beta2=0.95 max-grad-norm=1.0 lr-schedule=cosine warmup=10 total-steps=$STEPS min-lr=6e-5" \
  -mapp-insert-trace="granularity=layer" -mapp-insert-probes="spec=examples/probes.json" \
  -mapp-plan-memory -mapp-lower-to-plan -o "$OUT/train.mlir"
"$BIN/mapp-translate" --mapp-to-plan "$OUT/train.mlir" -o "$OUT/model.mplan"

# Byte-level configs (vocab <= 256) train on raw bytes, the rest on GPT-2 BPE.
TOKENIZER=gpt2:data/gpt/gpt2-vocab.json,data/gpt/gpt2-merges.txt
if [ "$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CONFIG")" -le 256 ]; then
  TOKENIZER=bytes
fi

announce "train on $BACKEND for $STEPS steps"
"$BIN/mapp-run" "$OUT/model.mplan" --backend="$BACKEND" \
  --data data/gpt/news-1k.jsonl \
  --tokenizer "$TOKENIZER" \
  --steps "$STEPS" --seed 1 --metrics "$OUT/metrics.jsonl" \
  --save "$OUT/final.safetensors" \
  --trace-dir "$OUT/traces" --probe-db "$OUT/probes.sqlite"
announce "MegaScan: merged trace and diagnosis"
"$BIN/mapp-scan" "$OUT/traces" -o "$OUT/merged.json" --report "$OUT/report.json" \
  --html "$OUT/report.html"
echo "== outputs in $OUT: metrics.jsonl, final.safetensors, traces/ (Perfetto:"
echo "   merged.json), report.html, probes.sqlite (view: $BIN/mapp-scope serve --db $OUT/probes.sqlite)"

# MegaDPP: a short 2-rank pipeline (pp=2, 2 chunks, 4 microbatches) whose
# link 1 -> 0 is slowed by 20 ms in steps 3..5. The adaptive scheduler runs
# depth-first, switches to breadth-first while the link is slow and back
# once it recovers; each switch is printed with its reason and recorded as an
# instant event on the MegaScan trace's "sched" track (docs/megadpp.md).
announce "MegaDPP: adaptive pipeline schedule under a slow link (pp=2 x 2 chunks, rank-threads)"
DPP=$OUT/dpp
mkdir -p "$DPP"
/usr/bin/python3 - "$DPP/gpt.json" <<'PY'
import json, sys
json.dump({"variant": "gpt", "num_layers": 4, "hidden_size": 64,
           "num_attention_heads": 4, "seq_length": 32, "vocab_size": 256,
           "micro_batch_size": 2, "tie_embeddings": True}, open(sys.argv[1], "w"))
PY
"$BIN/mapp-translate" --import-gpt-config "$DPP/gpt.json" -o "$DPP/model.mlir"
"$BIN/mapp-opt" "$DPP/model.mlir" \
  "--mapp-train-pipeline=tp=1 pp=2 dp=1 chunks=2 microbatches=4 schedule=adaptive optimizer=adamw lr=1e-3" \
  -o "$DPP/train.mlir" 2>/dev/null
# The plan carries the depth-first and the breadth-first table and the policy.
"$BIN/mapp-translate" --mapp-to-plan "$DPP/train.mlir" -o "$DPP/adaptive.mplan"
"$BIN/mapp-run" "$DPP/adaptive.mplan" --comm=local --threads 1 \
  --data data/gpt/news-1k.jsonl --tokenizer bytes --steps 8 --seed 1 \
  --inject link-delay:src=1,dst=0,us=20000,from-step=3,to-step=6 \
  --trace-dir "$DPP/traces" >"$DPP/run.log" 2>&1 || { cat "$DPP/run.log"; exit 1; }
grep -E "scheduler" "$DPP/run.log" || true
echo "   policy switches in the MegaScan trace (sched track):" \
  "$(cat "$DPP"/traces/rank-*.trace.jsonl | grep -c '"dpp ' || true)"

# MegaFBD: the same model with each pipeline stage's forward and backward
# split into separately placed subgraphs: backward at tp=2 on 4 ranks, the
# forward at tp=1 on 2 more ranks that ship the stage inputs (recompute), the
# updated parameters sent back every step (docs/megafbd.md).
announce "MegaFBD: forward (tp=1) and backward (tp=2) on separate ranks, pp=2"
"$BIN/mapp-opt" "$DPP/model.mlir" \
  "--mapp-train-pipeline=tp=2 pp=2 fbd=true fwd-tp=1 transfer=recompute microbatches=4 schedule=1f1b optimizer=adamw lr=1e-3" \
  -o "$DPP/fbd.mlir" 2>/dev/null
"$BIN/mapp-translate" --mapp-to-plan "$DPP/fbd.mlir" -o "$DPP/fbd.mplan"
"$BIN/mapp-run" "$DPP/fbd.mplan" --comm=local --threads 1 \
  --data data/gpt/news-1k.jsonl --tokenizer bytes --steps 4 --seed 1 2>&1 |
  grep -vE "scheduler static" || { echo "MegaFBD run failed"; exit 1; }

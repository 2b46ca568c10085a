#!/usr/bin/env bash
# Fills gpu/fbd (git-ignored, beside bench/gpu/prepare.sh's gpu/cuda) for
# the mixed CPU/GPU MegaFBD checks on the GPU machine: mapp-run (xz), the
# plans, initial weights, the corpus and run.sh. Then, from the repository
# root there: bash gpu/fbd/run.sh
# (carry gpu). Usage: bench/fbd/prepare-gpu.sh [RUNTIME_BUILD]
# RUNTIME_BUILD (default build-gpu-rt) is a runtime-only build without MPI
# (the GPU machine has no libmpi of ours), configured here if missing:
#   cmake -S runtime -B build-gpu-rt -G Ninja -DMAPP_ENABLE_CUDA=ON -DMAPP_ENABLE_MPI=OFF
# mapp-opt / mapp-translate come from build/bin.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$ROOT/build/bin
RT=${1:-$ROOT/build-gpu-rt}
[ -f "$RT/build.ninja" ] || cmake -S "$ROOT/runtime" -B "$RT" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DMAPP_ENABLE_CUDA=ON -DMAPP_ENABLE_MPI=OFF >/dev/null
ninja -C "$RT" -j2 mapp-run
D=$ROOT/gpu/fbd
rm -rf "$D" && mkdir -p "$D"
echo '{"variant":"gpt","num_layers":4,"hidden_size":128,"num_attention_heads":4,"seq_length":64,"vocab_size":256,"micro_batch_size":4,"tie_embeddings":true}' > "$D/cfg.json"
PYTHONPATH=$ROOT/python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
  --config "$D/cfg.json" -o "$D/model.mlir" --weights "$D/init.safetensors" --seed 7 >/dev/null
OPT="optimizer=adamw lr=0.003 microbatches=4 schedule=1f1b pp=2"
plan() {
  "$BIN/mapp-opt" "$D/model.mlir" --mapp-train-pipeline="$2 $OPT" -o "$D/$1.mlir" 2>/dev/null
  "$BIN/mapp-translate" --mapp-to-plan "$D/$1.mlir" -o "$D/$1.mplan"
  rm "$D/$1.mlir"
}
plan gpu "tp=1"
plan mixed-rec "tp=1 fbd=true fwd-tp=1 fwd-device=cpu bwd-device=cuda transfer=recompute"
plan mixed-act "tp=1 fbd=true fwd-tp=1 fwd-device=cpu bwd-device=cuda transfer=activations"
rm "$D/model.mlir"
# GPU memory with the forward on CPU ranks (run.sh, second part): pp=4,
# 8 microbatches, 1F1B, at micro-batch 8 and 16. No weights file: mapp-run
# initializes every layout alike from --seed.
for mb in 8 16; do
  echo "{\"variant\":\"gpt\",\"num_layers\":4,\"hidden_size\":256,\"num_attention_heads\":4,\"seq_length\":512,\"vocab_size\":256,\"micro_batch_size\":$mb,\"tie_embeddings\":true}" > "$D/cfg.json"
  PYTHONPATH=$ROOT/python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
    --config "$D/cfg.json" -o "$D/model.mlir" --seed 7 >/dev/null
  OPT="optimizer=adamw lr=0.003 microbatches=8 schedule=1f1b pp=4"
  plan mem-gpu-$mb "tp=1"
  plan mem-rec-$mb "tp=1 fbd=true fwd-tp=1 fwd-device=cpu bwd-device=cuda transfer=recompute"
  plan mem-act-$mb "tp=1 fbd=true fwd-tp=1 fwd-device=cpu bwd-device=cuda transfer=activations"
  rm "$D/model.mlir"
done
cp "$ROOT/data/gpt/news-1k.jsonl" "$D/"
RUNBIN=$RT/bin/mapp-run
[ -x "$RUNBIN" ] || RUNBIN=$RT/mapp-run # a runtime-only build puts it at the top
xz -T1 -c "$RUNBIN" > "$D/mapp-run.xz"
cp "$ROOT/bench/fbd/run-gpu.sh" "$D/run.sh"
du -sh "$D"

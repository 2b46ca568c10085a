#!/usr/bin/env bash
# Fills OUT_DIR (default gpu/curves) for bench/gpu/curves.sh: 100-step loss
# curves of the four benchmark models (issue 35: GPT 124M, GPT 1.3B, the
# LLaMA-style 1B, the 1B-active MoE) against PyTorch bf16, each plan
# unfused and with --mapp-fuse (issue 37), at micro-batch 2 (PyTorch's side
# is mapp.reference.GPT, whose attention materializes its scores). The plans
# come from the config importer, as the benchmark's do: its parameters carry
# mapp.reference.GPT's names and shapes, so the curve starts from the
# reference's initial weights.
#   bench/gpu/prepare_curves.sh [BUILD_DIR]     (mapp-run with CUDA)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build/bin}
BIN=${MAPP_BIN:-build/bin}
OUT=${OUT_DIR:-gpu/curves}
MODELS=${CURVE_MODELS:-gpt-124m gpt-1.3b llama-1b gpt-moe-1b}
OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
# The benchmark plans' passes (bench/gpu/prepare.sh): recomputed GELU
# outputs, bf16 activation storage.
PASSES=(-mapp-autodiff --mapp-recompute=policy=activations "-mapp-optimizer=$OPT")
MEM=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
rm -rf "$OUT" && mkdir -p "$OUT/plans" "$OUT/bin" "$OUT/configs"
xz -T2 -6 -c "$BUILD/mapp-run" > "$OUT/bin/mapp-run.xz"
cp -r python/mapp "$OUT/mapp" && find "$OUT/mapp" -name __pycache__ -prune -exec rm -rf {} +
cp bench/gpu/curves.sh bench/gpu/e2e_check.py "$OUT/"
cp data/gpt/news-1k.jsonl "$OUT/corpus.jsonl"
for c in $MODELS; do
  /usr/bin/python3 - "bench/gpu/configs/$c.json" "$OUT/configs/$c.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["micro_batch_size"] = 2
cfg["_comment"] = "100-step curve (bench/gpu/curves.sh), micro-batch 2: " + cfg.get("_comment", "")
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
PY
  "$BIN/mapp-translate" --import-gpt-config "$OUT/configs/$c.json" -o "$OUT/plans/$c.mlir"
  for v in plain fused; do
    fuse=(); [ $v = fused ] && fuse=(-mapp-fuse)
    "$BIN/mapp-opt" "$OUT/plans/$c.mlir" "${PASSES[@]}" "${fuse[@]}" "${MEM[@]}" \
      -o "$OUT/plans/$c.$v.mlir" 2> "$OUT/plans/$c.$v.remarks.txt"
    "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$c.$v.mlir" -o "$OUT/plans/$c.$v.mplan"
    echo "$c $v: $(grep -c 'mapp.fused' "$OUT/plans/$c.$v.mlir" || true) fused ops"
    rm "$OUT/plans/$c.$v.mlir"
  done
  rm "$OUT/plans/$c.mlir"
done
du -sh "$OUT"

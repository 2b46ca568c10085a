#!/usr/bin/env bash
# Stages the fp8 bundle for bench/gpu/fp8.sh (default /work/main/gpu/fp8;
# OUT_DIR overrides), run on the device as gpu/fp8/run.sh [all|check|bench]:
#   bench/gpu/fp8_prepare.sh [RUNTIME_BUILD_DIR]
# RUNTIME_BUILD_DIR (default build-rt) has mapp-run and mapp-cuda-fp8-test
# built with -DMAPP_ENABLE_CUDA=ON -DMAPP_ENABLE_MPI=OFF (rebuilt first);
# mapp-opt / mapp-translate come from $MAPP_BIN (default build/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
RT=${1:-build-rt}
BIN=${MAPP_BIN:-build/bin}
OUT=${OUT_DIR:-/work/main/gpu/fp8}
BENCH_OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
OPT="lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BF16=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
ninja -C "$RT" -j2 mapp-run mapp-cuda-fp8-test
ninja -C "$(dirname "$BIN")" -j2 mapp-opt mapp-translate
rm -rf "$OUT" && mkdir -p "$OUT/plans" "$OUT/bin"
for b in mapp-run mapp-cuda-fp8-test; do
  src="$RT/$b"; [ -f "$src" ] || src="$RT/bin/$b"
  xz -T2 -6 -c "$src" > "$OUT/bin/$b.xz"
done
cp bench/gpu/fp8.sh "$OUT/run.sh"
cp bench/gpu/common.sh bench/gpu/fp8_curves.py bench/gpu/fp8_torch_check.py \
  test/python/fp8_ref.py "$OUT/"
cp data/gpt/news-1k.jsonl "$OUT/corpus.jsonl"
plan() { # config optimizer precision out
  "$BIN/mapp-translate" --import-gpt-config "bench/gpu/configs/$1.json" -o /tmp/mapp-fp8-$4.mlir
  "$BIN/mapp-opt" /tmp/mapp-fp8-$4.mlir -mapp-autodiff "-mapp-optimizer=$2" \
    "-mapp-mixed-precision=$3" "${BF16[@]}" -o /tmp/mapp-fp8-$4.train.mlir 2>> /tmp/mapp-fp8-prepare.log
  "$BIN/mapp-translate" --mapp-to-plan /tmp/mapp-fp8-$4.train.mlir -o "$OUT/plans/$4.mplan"
  rm /tmp/mapp-fp8-$4.mlir /tmp/mapp-fp8-$4.train.mlir
}
for c in gpt-124m gpt-1.3b; do
  plan $c "$BENCH_OPT" "compute=bf16" $c.bf16
  plan $c "$BENCH_OPT" "compute=fp8 fp8-format=hybrid fp8-history=16 fp8-margin=0" $c.fp8
done
plan gpt-e2e "$OPT" "compute=fp8 fp8-history=16" gpt-e2e.fp8
du -sh "$OUT"

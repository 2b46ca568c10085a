#!/usr/bin/env bash
# Builds the MoE device bundle (bench/gpu/moe.sh) into one folder (default
# /work/main/gpu/moe; OUT_DIR overrides), run on the development machine:
#   bench/gpu/prepare_moe.sh [RUNTIME_BUILD_DIR]   (default build-rt: a
#   -DMAPP_ENABLE_CUDA=ON -DMAPP_ENABLE_MPI=OFF runtime build; rebuilt first)
# mapp-opt / mapp-translate come from $MAPP_BIN (default build/bin).
# Contents: xz'd mapp-run, mapp-cuda-moe-test and a deliberately broken
# build of the test (three bugs patched into Moe.cu for one compile, then
# reverted), the plans, the python reference package, configs, scripts and
# the corpus. On the device: bash gpu/moe/run.sh check|bench|all.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-rt}
BIN=${MAPP_BIN:-build/bin}
OUT=${OUT_DIR:-/work/main/gpu/moe}
OPT="lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BENCH_OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BF16=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
MOE=runtime/src/backend/cuda/Moe.cu

ninja -C "$BUILD" mapp-run mapp-cuda-moe-test
# The broken build: router ties to the higher expert, capacity ties keep
# one choice too many, the last expert's forward GEMM skipped.
cp "$MOE" /tmp/mapp-moe-good.cu
trap 'cp /tmp/mapp-moe-good.cu "$MOE"' EXIT
sed -i 's/return v > bv || (v == bv \&\& i < bi);/return v > bv || (v == bv \&\& i > bi);/' "$MOE"
sed -i 's/(eq \&\& carry + before < remain)/(eq \&\& carry + before <= remain)/' "$MOE"
sed -i '0,/for (int64_t g = 0; g < e; ++g) {/s//for (int64_t g = 0; g < e - 1; ++g) {/' "$MOE"
[ "$(diff /tmp/mapp-moe-good.cu "$MOE" | grep -c '^>')" = 3 ] || { echo "broken patch did not apply"; exit 1; }
ninja -C "$BUILD" mapp-cuda-moe-test
cp "$BUILD/mapp-cuda-moe-test" /tmp/mapp-cuda-moe-test-broken
cp /tmp/mapp-moe-good.cu "$MOE"
trap - EXIT
ninja -C "$BUILD" mapp-run mapp-cuda-moe-test

rm -rf "$OUT" && mkdir -p "$OUT/plans" "$OUT/bin" "$OUT/configs"
xz -T2 -6 -c "$BUILD/mapp-run" > "$OUT/bin/mapp-run.xz"
xz -T2 -6 -c "$BUILD/mapp-cuda-moe-test" > "$OUT/bin/mapp-cuda-moe-test.xz"
xz -T2 -6 -c /tmp/mapp-cuda-moe-test-broken > "$OUT/bin/mapp-cuda-moe-test-broken.xz"
rm /tmp/mapp-cuda-moe-test-broken
cp -r python/mapp "$OUT/mapp" && find "$OUT/mapp" -name __pycache__ -prune -exec rm -rf {} +
cp bench/gpu/moe.sh "$OUT/run.sh"
cp bench/gpu/moe_check.py bench/gpu/torch_moe.py bench/gpu/torch_train.py bench/gpu/moe_summary.py "$OUT/"
cp bench/gpu/configs/gpt-moe-*.json "$OUT/configs/"
cp data/gpt/news-1k.jsonl "$OUT/corpus.jsonl"
plan() { # config optimizer [plan-name memory-flags...]
  local c=$1 opt=$2 P="$OUT/plans/${3:-$1}"
  local mem=("${BF16[@]}")
  [ $# -gt 3 ] && mem=("${@:4}")
  "$BIN/mapp-translate" --import-gpt-config "bench/gpu/configs/$c.json" -o "$P.mlir"
  "$BIN/mapp-opt" "$P.mlir" -mapp-autodiff "-mapp-optimizer=$opt" "${mem[@]}" -o "$P.train.mlir" 2> "$P.memory.txt"
  sed -i -n 1p "$P.memory.txt" # the memory plan remark
  "$BIN/mapp-translate" --mapp-to-plan "$P.train.mlir" -o "$P.mplan"
  rm "$P.mlir" "$P.train.mlir"
}
for c in gpt-moe-e2e gpt-moe-e2e-cap; do
  plan $c "$OPT"
  # fp32 activations for the CPU run: the fp32 oracle's twin (moe.sh).
  plan $c "$OPT" $c.f32 -mlir-print-op-on-diagnostic=false
done
plan gpt-moe-1b "$BENCH_OPT"
du -sh "$OUT"

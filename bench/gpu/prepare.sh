#!/usr/bin/env bash
# Builds everything bench/gpu.sh needs into one folder that the device tool
# carries (default /work/main/gpu/cuda; OUT_DIR overrides): the CUDA-enabled
# runtime binaries, compiled plans (+ initial weights for the e2e checks), the
# python reference package and the scripts. Run on the development machine:
#   bench/gpu/prepare.sh [BUILD_DIR]      (BUILD_DIR has mapp-run & co., built
#   with -DMAPP_ENABLE_CUDA=ON -DMAPP_ENABLE_MPI=OFF so nothing needs libmpi;
#   it is rebuilt first)
# mapp-opt / mapp-translate / mapp-scan come from $MAPP_BIN (default
# build/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-build/bin}
BIN=${MAPP_BIN:-build/bin}
OUT=${OUT_DIR:-/work/main/gpu/cuda}
OPT="lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BENCH_OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
# Activations planned at 2 bytes an element, as the CUDA backend stores them
# (the report remark goes to the log as one line).
BF16=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
# The bench plans recompute each MLP's GELU output in the backward instead
# of saving it (torch.compile's partitioner makes the same trade): 6 GiB
# less at 1.3B for one elementwise pass per layer (docs/recompute.md).
RECOMPUTE=(--mapp-recompute=policy=activations)
# Bring the binaries up to date first (when DIR or its parent is a Ninja
# build): a stale or half-rebuilt runtime (a header changed under a build:
# objects with two vtable layouts) only fails on the device, where every
# try costs lease time.
refresh() { # DIR TARGET...
  local d=$1
  shift
  for b in "$d" "$d/.."; do
    if [ -f "$b/build.ninja" ]; then
      ninja -C "$b" "$@"
      return
    fi
  done
}
refresh "$BUILD" mapp-run mapp-cuda-kernel-test mapp-attn-bench \
  mapp-cuda-trace-test mapp-cuda-probe-test mapp-cuda-comm-test
refresh "$BIN" mapp-opt mapp-translate mapp-scan
rm -rf "$OUT" && mkdir -p "$OUT/plans" "$OUT/bin"
# xz: the binaries carry static OpenBLAS and cudart (~30 MB each); the device
# tool's tree limit is 64 MiB. gpu.sh unpacks them.
for b in mapp-run mapp-cuda-kernel-test; do
  xz -T2 -6 -c "$BUILD/$b" > "$OUT/bin/$b.xz"
done
cp -r python/mapp "$OUT/mapp"
cp bench/gpu/*.py bench/gpu/common.sh bench/gpu.sh bench/gpu/llama.sh "$OUT/"
cp -r bench/gpu/configs "$OUT/configs"
cp data/gpt/news-1k.jsonl "$OUT/corpus.jsonl"
for c in gpt-tiny-e2e gpt-e2e llama-e2e; do
  # Initial weights are written on the device (e2e_check.py init): same
  # GPT(cfg, seed=7) as the exporter's, without carrying megabytes.
  PYTHONPATH=python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
    --config bench/gpu/configs/$c.json -o "$OUT/plans/$c.mlir" \
    --weights /tmp/mapp-prepare-init.safetensors --seed 7
  "$BIN/mapp-opt" "$OUT/plans/$c.mlir" -mapp-autodiff "-mapp-optimizer=$OPT" \
    "${BF16[@]}" -o "$OUT/plans/$c.train.mlir"
  "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$c.train.mlir" -o "$OUT/plans/$c.mplan"
  rm "$OUT/plans/$c.mlir" "$OUT/plans/$c.train.mlir"
done
for c in gpt-124m gpt-1.3b llama-1b; do
  "$BIN/mapp-translate" --import-gpt-config bench/gpu/configs/$c.json -o "$OUT/plans/$c.mlir"
  "$BIN/mapp-opt" "$OUT/plans/$c.mlir" -mapp-autodiff "${RECOMPUTE[@]}" \
    "-mapp-optimizer=$BENCH_OPT" "${BF16[@]}" -o "$OUT/plans/$c.train.mlir"
  "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$c.train.mlir" -o "$OUT/plans/$c.mplan"
  rm "$OUT/plans/$c.mlir" "$OUT/plans/$c.train.mlir"
done
# --- fuse (bench/gpu/fuse.sh: epilogue fusion, fused vs unfused on the bench
# plans above; run as gpu/cuda/fuse.sh)
cp bench/gpu/fuse.sh "$OUT/"
# --- end fuse
# --- attn: attention implementations vs PyTorch SDPA (bench/gpu/attn.sh)
xz -T2 -6 -c "$BUILD/mapp-attn-bench" > "$OUT/bin/mapp-attn-bench.xz"
cp bench/gpu/attn.sh bench/gpu/gqa.sh "$OUT/"
# --- trace (bench/gpu/trace.sh): the bench plans with op-level trace regions,
# the gpu-labelled trace test and mapp-scan.
for c in gpt-124m gpt-1.3b; do
  "$BIN/mapp-translate" --import-gpt-config bench/gpu/configs/$c.json -o "$OUT/plans/$c.mlir"
  "$BIN/mapp-opt" "$OUT/plans/$c.mlir" -mapp-autodiff "${RECOMPUTE[@]}" \
    "-mapp-optimizer=$BENCH_OPT" -mapp-insert-trace=granularity=op "${BF16[@]}" \
    -o "$OUT/plans/$c.traced.mlir"
  "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$c.traced.mlir" -o "$OUT/plans/$c.traced.mplan"
  rm "$OUT/plans/$c.mlir" "$OUT/plans/$c.traced.mlir"
done
# mapp-scan has no CUDA code: it comes from the main build, with mapp-opt.
xz -T2 -6 -c "$BUILD/mapp-cuda-trace-test" > "$OUT/bin/mapp-cuda-trace-test.xz"
xz -T2 -6 -c "$BIN/mapp-scan" > "$OUT/bin/mapp-scan.xz"
cp bench/gpu/trace.sh "$OUT/"
# --- end trace
# --- scope (bench/gpu/scope.sh): the device probe test, plans with probes
xz -T2 -6 -c "$BUILD/mapp-cuda-probe-test" > "$OUT/bin/mapp-cuda-probe-test.xz"
cp bench/gpu/scope.sh "$OUT/"
scope_plan() { # config spec optimizer out
  "$BIN/mapp-translate" --import-gpt-config "bench/gpu/configs/$1.json" -o "$OUT/plans/$4.mlir"
  "$BIN/mapp-opt" "$OUT/plans/$4.mlir" -mapp-autodiff "-mapp-optimizer=$3" "${BF16[@]}" \
    "-mapp-insert-probes=spec=bench/gpu/scope/$2.json" -o "$OUT/plans/$4.train.mlir"
  "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$4.train.mlir" -o "$OUT/plans/$4.mplan"
  rm "$OUT/plans/$4.mlir" "$OUT/plans/$4.train.mlir"
}
scope_plan gpt-tiny-e2e e2e "$OPT" scope-e2e
for c in 124m 1.3b; do
  scope_plan gpt-$c reduced "$BENCH_OPT" scope-$c-reduced
  scope_plan gpt-$c raw "$BENCH_OPT" scope-$c-raw
done
# --- end scope
# --- comm: multi-rank GPT plans for bench/gpu/comm.sh (gpt-e2e, head dim 64)
# The global batch is 8 rows in every layout: the reference is one
# microbatch of 8, the parallel plans microbatches of 2 (dp * M * 2 = 8).
mkdir -p "$OUT/plans/comm"
xz -T2 -6 -c "$BUILD/mapp-cuda-comm-test" > "$OUT/bin/mapp-cuda-comm-test.xz"
cp bench/gpu/comm.sh bench/gpu/nccl.sh "$OUT/"
COMM_OPT="optimizer=adamw $OPT max-grad-norm=1.0"
for rows in 8 2; do
  /usr/bin/python3 -c "import json,sys; c=json.load(open('bench/gpu/configs/gpt-e2e.json')); c['micro_batch_size']=$rows; json.dump(c, open('/tmp/mapp-comm-cfg$rows.json','w'))"
  PYTHONPATH=python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
    --config /tmp/mapp-comm-cfg$rows.json -o /tmp/mapp-comm-$rows.mlir --seed 7
done
"$BIN/mapp-opt" /tmp/mapp-comm-8.mlir -mapp-autodiff "-mapp-optimizer=$COMM_OPT" \
  "${BF16[@]}" -o /tmp/mapp-comm-ref.mlir
"$BIN/mapp-translate" --mapp-to-plan /tmp/mapp-comm-ref.mlir -o "$OUT/plans/comm/single.mplan"
for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 1"; do
  read -r tp pp dp <<< "$layout"
  micro=$((8 / (2 * dp)))
  "$BIN/mapp-opt" /tmp/mapp-comm-2.mlir \
    "--mapp-train-pipeline=tp=$tp pp=$pp dp=$dp chunks=1 microbatches=$micro schedule=1f1b $COMM_OPT" \
    "${BF16[@]}" -o /tmp/mapp-comm-par.mlir
  "$BIN/mapp-translate" --mapp-to-plan /tmp/mapp-comm-par.mlir \
    -o "$OUT/plans/comm/tp${tp}pp${pp}dp${dp}.mplan"
done
rm -f /tmp/mapp-comm-*.mlir /tmp/mapp-comm-cfg*.json
# --- end comm
# --- planab (bench/gpu/planab.sh): the bench plans without one plan-level
# optimization each (copy: every reshape copies; noconcat: the qkv gradient
# as slice_grads + adds; f32arena: fp32-sized activation slots; saveact: the
# GELU outputs saved, not recomputed), and the memory plan's figures of each.
cp bench/gpu/planab.sh "$OUT/"
plan_stats() { # train.mlir out.txt (its mapp.activation_storage applies)
  "$BIN/mapp-opt" "$1" -mapp-plan-memory -o /dev/null 2>&1 |
    sed -n 's/.* arena \([0-9]*\) B (.*reshapes: \(.*\)$/arena \1 B, reshapes \2/p' > "$2"
}
for c in gpt-124m gpt-1.3b; do
  P="$OUT/plans/$c"
  "$BIN/mapp-translate" --import-gpt-config bench/gpu/configs/$c.json -o "$P.mlir"
  "$BIN/mapp-opt" "$P.mlir" -mapp-autodiff "${RECOMPUTE[@]}" \
    "-mapp-optimizer=$BENCH_OPT" -o "$P.f32.mlir"
  "$BIN/mapp-opt" "$P.f32.mlir" "${BF16[@]}" -o "$P.train.mlir"
  "$BIN/mapp-opt" "$P.mlir" -mapp-autodiff=concat-slice-grads=false "${RECOMPUTE[@]}" \
    "-mapp-optimizer=$BENCH_OPT" "${BF16[@]}" -o "$P.noconcat.mlir"
  "$BIN/mapp-opt" "$P.mlir" -mapp-autodiff "-mapp-optimizer=$BENCH_OPT" \
    "${BF16[@]}" -o "$P.saveact.mlir"
  "$BIN/mapp-translate" --mapp-to-plan "$P.saveact.mlir" -o "$P.saveact.mplan"
  plan_stats "$P.saveact.mlir" "$P.saveact.stats.txt"
  "$BIN/mapp-translate" --mapp-to-plan --mapp-plan-copy-reshapes "$P.train.mlir" -o "$P.copy.mplan"
  "$BIN/mapp-translate" --mapp-to-plan "$P.noconcat.mlir" -o "$P.noconcat.mplan"
  "$BIN/mapp-translate" --mapp-to-plan "$P.f32.mlir" -o "$P.f32arena.mplan"
  plan_stats "$P.train.mlir" "$P.base.stats.txt"
  plan_stats "$P.noconcat.mlir" "$P.noconcat.stats.txt"
  plan_stats "$P.f32.mlir" "$P.f32arena.stats.txt"
  echo "arena without reshape views: see the copy run's peak" > "$P.copy.stats.txt"
  rm "$P.mlir" "$P.f32.mlir" "$P.train.mlir" "$P.noconcat.mlir" "$P.saveact.mlir"
done
# --- end planab
# --- recompute (bench/gpu/recompute.sh): the 1.3B plan without recompute,
# with policy=selective and policy=full at micro-batch 8, and micro-batch 40
# (155.6 GiB planned without recompute, 43.1 GiB with full).
MAPP_BIN="$BIN" bench/gpu/recompute.sh --prepare "$OUT" gpt-1.3b 8 40
# --- end recompute
du -sh "$OUT"

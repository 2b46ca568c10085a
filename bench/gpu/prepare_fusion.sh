#!/usr/bin/env bash
# Fills OUT_DIR (default gpu/fusion) for two runs on the GPU machine, over
# the four benchmark models (GPT 124M, GPT 1.3B, the LLaMA-style 1B, the
# 1B-active MoE), each plan unfused, with --mapp-fuse, and with the norms
# written with the algebra before it (--mapp-decompose-norms):
#   curves.sh   100-step bf16 loss curves against PyTorch (issues 35, 37), at
#               micro-batch 2 (PyTorch's side, mapp.reference.GPT, keeps its
#               attention scores in memory);
#   fusion_call.sh  one call: the CUDA kernel test, then the two below;
#   kernels.sh  kernels launched and device time per step by class (GEMM,
#               attention, the rest), mapp against torch.compile, counted by
#               the same CUPTI census (kernel_census.cpp; issue 37), at the
#               benchmark's micro-batch.
# The plans come from the config importer, as the benchmark's do; its
# parameters carry mapp.reference.GPT's names and shapes, so a curve starts
# from the reference's initial weights.
#   bench/gpu/prepare_fusion.sh [BUILD_DIR]     (a mapp-run with CUDA)
#   BASE_BIN=/path/to/other/mapp-run bench/gpu/prepare_fusion.sh   (a baseline)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build/bin}
BIN=${MAPP_BIN:-build/bin}
OUT=${OUT_DIR:-gpu/fusion}
MODELS=${FUSION_MODELS:-gpt-124m gpt-1.3b llama-1b gpt-moe-1b}
CUDA=${CUDA_HOME:-/usr/local/cuda}
OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
MEM=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
rm -rf "$OUT" && mkdir -p "$OUT/plans" "$OUT/bin" "$OUT/configs"
xz -T2 -6 -c "$BUILD/mapp-run" > "$OUT/bin/mapp-run.xz"
[ -x "$BUILD/mapp-cuda-kernel-test" ] && xz -T2 -6 -c "$BUILD/mapp-cuda-kernel-test" > "$OUT/bin/mapp-cuda-kernel-test.xz"
# BASE_BIN: another commit's mapp-run, a baseline row in kernels.sh.
[ -n "${BASE_BIN:-}" ] && xz -T2 -6 -c "$BASE_BIN" > "$OUT/bin/mapp-run-base.xz"
g++ -O2 -std=c++17 -shared -fPIC -I"$CUDA/include" bench/gpu/kernel_census.cpp \
  -L"$CUDA/lib64" -L"$CUDA/lib" -lcupti -Wl,-rpath,'$ORIGIN' \
  -o "$OUT/bin/libmapp-kernel-census.so"
cp -L "$(ldd "$OUT/bin/libmapp-kernel-census.so" | awk '/libcupti/ {print $3}')" "$OUT/bin/"
cp -r python/mapp "$OUT/mapp" && find "$OUT/mapp" -name __pycache__ -prune -exec rm -rf {} +
cp bench/gpu/common.sh bench/gpu/fusion_call.sh bench/gpu/curves.sh bench/gpu/kernels.sh bench/gpu/kernels.py bench/gpu/e2e_check.py \
  bench/gpu/moe_check.py bench/gpu/torch_train.py bench/gpu/torch_gpt.py bench/gpu/torch_llama.py \
  bench/gpu/torch_moe.py "$OUT/"
cp data/gpt/news-1k.jsonl "$OUT/corpus.jsonl"
for c in $MODELS; do
  cp "bench/gpu/configs/$c.json" "$OUT/configs/$c.bench.json"
  # The curves' recipe (CURVE_TRAIN, "none" for a constant lr without
  # clipping): clipping and a warmup-cosine schedule, as GPT training runs
  # use; without them the GPT configs spike at lr 3e-4 on 2-sequence
  # batches and two bf16 runs part there. In the curve config for
  # e2e_check.py, and as the curve plan's optimizer options.
  curve_opt=$(/usr/bin/python3 - "bench/gpu/configs/$c.json" "$OUT/configs/$c.curve.json" \
      "${CURVE_TRAIN:-clip=1.0 warmup=10 total_steps=100 min_lr=3e-5}" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["micro_batch_size"] = 2
cfg["_comment"] = "100-step curve (bench/gpu/curves.sh), micro-batch 2: " + cfg.get("_comment", "")
train = {} if sys.argv[3] == "none" else {
    k: float(v) if k in ("clip", "min_lr") else int(v)
    for k, v in (item.split("=") for item in sys.argv[3].split())}
if train:
    cfg["_curve_train"] = train
json.dump(cfg, open(sys.argv[2], "w"), indent=1)
opts = []
if train.get("clip"):
    opts.append(f"max-grad-norm={train['clip']}")
if train.get("warmup") or train.get("total_steps"):
    opts += ["lr-schedule=cosine", f"warmup={train.get('warmup', 0)}",
             f"total-steps={train.get('total_steps', 0)}", f"min-lr={train.get('min_lr', 0.0)}"]
print(" ".join(opts))
PY
  )
  # The benchmark plans' passes (bench/gpu/prepare.sh, prepare_moe.sh): the
  # dense models recompute GELU outputs; bf16 activation storage.
  recompute=(--mapp-recompute=policy=activations)
  case $c in gpt-moe-*) recompute=() ;; esac
  for use in curve bench; do
    opt=$OPT
    [ $use = curve ] && opt="$OPT $curve_opt"
    passes=(-mapp-autodiff "${recompute[@]}" "-mapp-optimizer=$opt")
    "$BIN/mapp-translate" --import-gpt-config "$OUT/configs/$c.$use.json" -o "$OUT/plans/$c.mlir"
    for v in plain fused norms; do
      # norms: the norms written with the algebra (--mapp-decompose-norms),
      # so generated row programs replace the hand-written norm kernels.
      pre=(); fuse=()
      [ $v = plain ] || fuse=(-mapp-fuse)
      [ $v = norms ] && pre=(-mapp-decompose-norms)
      "$BIN/mapp-opt" "$OUT/plans/$c.mlir" "${pre[@]}" "${passes[@]}" "${fuse[@]}" "${MEM[@]}" \
        -o "$OUT/plans/$c.$use.$v.mlir" 2> /dev/null
      "$BIN/mapp-translate" --mapp-to-plan "$OUT/plans/$c.$use.$v.mlir" -o "$OUT/plans/$c.$use.$v.mplan"
      echo "$c $use $v: $(grep -c 'mapp.fused' "$OUT/plans/$c.$use.$v.mlir" || true) fused ops"
      rm "$OUT/plans/$c.$use.$v.mlir"
    done
    rm "$OUT/plans/$c.mlir"
  done
done
du -sh "$OUT"

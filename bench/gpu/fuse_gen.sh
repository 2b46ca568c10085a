#!/usr/bin/env bash
# Generated kernels of mapp.fused on the GPU (issue 37, docs/fusion.md,
# "CUDA: generated kernels"). Two halves:
#
#   bench/gpu/fuse_gen.sh --prepare DIR [BUILD_BIN]    (development machine)
#     compiles the plans and collects the fused programs into DIR (no GPU;
#     BUILD_BIN: a CUDA-enabled build's bin, default build/bin; mapp-opt,
#     mapp-translate from $MAPP_BIN or BUILD_BIN);
#   DIR/fuse_gen.sh --plans DIR                         (the GPU machine)
#     needs only DIR, python3 and the CUDA toolkit's libnvrtc (no LLVM):
#  1. mapp-cuda-kernel-test on every generated kernel (the edge cases and
#     every program --mapp-fuse formed in the lit tests and the models)
#     against the program in double, f32 and bf16 storage (tolerances 1e-5
#     and 2e-2);
#  2. the GeGLU model with RMS norms and the squared-ReLU model with
#     LayerNorms, both with QK-norm (models/fused_mlp.py, exported
#     --no-recognize; every norm one region, a row program) compiled with and without --mapp-fuse: 20
#     CUDA steps each, the losses against a CPU fp32 run of the unfused plan
#     (bf16 bar 2e-2) and fused against unfused on CUDA (same bar); the fused
#     run again to show the kernel cache (no compile);
#  3. the LLaMA-style bench config (configs/llama-1b.json, imported) with and
#     without --mapp-fuse: median step time after warm-up.
# Prints PASS/FAIL and the figures last. Logs in $OUT (when set) or /tmp.
set -uo pipefail
OPT="lr=1e-3 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BENCH_OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
BF16=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
STEPS=20

if [ "${1:-}" = --prepare ]; then
  set -e
  DIR=$(mkdir -p "$2" && cd "$2" && pwd)
  cd "$(dirname "$0")/../.."
  BUILD=${3:-build/bin}
  BIN=${MAPP_BIN:-$BUILD}
  mkdir -p "$DIR/plans" "$DIR/bin"
  for b in mapp-run mapp-cuda-kernel-test; do
    xz -T2 -6 -c "$BUILD/$b" > "$DIR/bin/$b.xz"
  done
  cp bench/gpu/fuse_gen.sh bench/gpu/common.sh bench/gpu/runstats.py "$DIR/"
  cp data/gpt/news-1k.jsonl "$DIR/corpus.jsonl"
  export PYTHONPATH=$PWD/python:$PWD/test/python
  mlirs=()
  for lit in test/Transforms/Fusion/*.mlir; do
    "$BIN/mapp-opt" "$lit" -mapp-fuse -split-input-file -o "$DIR/plans/$(basename "$lit" .mlir).lit.mlir"
    mlirs+=("$DIR/plans/$(basename "$lit" .mlir).lit.mlir")
  done
  for mlp in geglu sqrelu; do
    norm=rms
    [ $mlp = sqrelu ] && norm=layer
    echo "{\"vocab_size\": 256, \"micro_batch_size\": 4, \"seq_length\": 64, \"dim\": 128,
           \"n_heads\": 4, \"n_layers\": 2, \"hidden\": 384, \"eps\": 1e-5, \"mlp\": \"$mlp\",
           \"norm\": \"$norm\"}" \
      > "$DIR/plans/$mlp.json"
    /usr/bin/python3 -m mapp.export --module models.fused_mlp:FusedMlp --config "$DIR/plans/$mlp.json" \
      -o "$DIR/plans/$mlp.mlir" --weights "$DIR/plans/$mlp.init.safetensors" --seed 7 --no-recognize
    for v in fused unfused cpu; do
      extra=()
      [ $v = fused ] && extra=(-mapp-fuse)
      [ $v != cpu ] && extra+=("${BF16[@]}")
      "$BIN/mapp-opt" "$DIR/plans/$mlp.mlir" -mapp-autodiff "-mapp-optimizer=$OPT" "${extra[@]}" \
        -o "$DIR/plans/$mlp.$v.mlir"
      "$BIN/mapp-translate" --mapp-to-plan "$DIR/plans/$mlp.$v.mlir" -o "$DIR/plans/$mlp.$v.mplan"
    done
    mlirs+=("$DIR/plans/$mlp.fused.mlir")
  done
  # The maxima model (models/maxout_zloss.py): its regions with reduce_max
  # and their gradients join the kernel check.
  echo '{"vocab_size": 256, "micro_batch_size": 4, "seq_length": 64, "d_model": 128,
         "n_heads": 4, "n_layers": 2, "hidden": 256, "pieces": 3}' > "$DIR/plans/maxout.json"
  /usr/bin/python3 -m mapp.export --module models.maxout_zloss:MaxoutGPT \
    --config "$DIR/plans/maxout.json" -o "$DIR/plans/maxout.mlir" --no-recognize
  "$BIN/mapp-opt" "$DIR/plans/maxout.mlir" -mapp-autodiff "-mapp-optimizer=$OPT" -mapp-fuse \
    "${BF16[@]}" -o "$DIR/plans/maxout.fused.mlir"
  mlirs+=("$DIR/plans/maxout.fused.mlir")
  /usr/bin/python3 -m mapp.fused_cases "${mlirs[@]}" -o "$DIR/cases.tsv"
  rm "$DIR/plans/maxout".*
  "$BIN/mapp-translate" --import-gpt-config bench/gpu/configs/llama-1b.json -o "$DIR/plans/llama.mlir"
  for v in fused unfused; do
    extra=()
    [ $v = fused ] && extra=(-mapp-fuse)
    "$BIN/mapp-opt" "$DIR/plans/llama.mlir" -mapp-autodiff --mapp-recompute=policy=activations \
      "-mapp-optimizer=$BENCH_OPT" "${extra[@]}" "${BF16[@]}" -o "$DIR/plans/llama.$v.mlir"
    "$BIN/mapp-translate" --mapp-to-plan "$DIR/plans/llama.$v.mlir" -o "$DIR/plans/llama-1b.$v.mplan"
    echo "llama-1b $v: $(grep -c 'mapp.fused ' "$DIR/plans/llama.$v.mlir") fused ops" | tee -a "$DIR/prepared.txt"
    rm "$DIR/plans/llama.$v.mlir"
  done
  rm "$DIR/plans/llama.mlir" "$DIR/plans/"*.lit.mlir
  for mlp in geglu sqrelu; do
    echo "$mlp: $(grep -c 'mapp.fused ' "$DIR/plans/$mlp.fused.mlir") fused ops" | tee -a "$DIR/prepared.txt"
    rm "$DIR/plans/$mlp".*.mlir "$DIR/plans/$mlp.mlir"
  done
  du -sh "$DIR"
  exit 0
fi

[ "${1:-}" = --plans ] || { echo "usage: $0 --prepare DIR [BUILD_BIN] | --plans DIR" >&2; exit 2; }
D=$(cd "$2" && pwd)
LOG=${OUT:-/tmp/mapp-fuse-gen}
mkdir -p "$LOG"
export PYTHONPATH=$D${PYTHONPATH:+:$PYTHONPATH} # runstats.py
source "$D/common.sh"
unpack mapp-run mapp-cuda-kernel-test
export MAPP_KERNEL_CACHE=$LOG/kernel-cache
rm -rf "$MAPP_KERNEL_CACHE"
cat "$D/prepared.txt"

echo "== 1. generated kernels vs the programs in double"
if MAPP_FUSED_CASES=$D/cases.tsv timeout 300 $BIN/mapp-cuda-kernel-test "fused " \
    > "$LOG/kernels.log" 2>&1; then
  record "kernels: $(tail -1 "$LOG/kernels.log") (fused programs: $(wc -l < "$D/cases.tsv") collected + the edge cases)" 0
else
  grep FAIL "$LOG/kernels.log" | head -20
  record "kernels: FAILED ($(tail -1 "$LOG/kernels.log"))" 1
fi

run() { # NAME PLAN BACKEND [STEPS] [extra mapp-run args...]
  local name=$1 plan=$2 be=$3 steps=${4:-$STEPS}
  shift 4
  MAPP_CUDA_FUSE_LOG=1 timeout 300 $BIN/mapp-run "$D/plans/$plan.mplan" --backend=$be \
    --data "$D/corpus.jsonl" --tokenizer bytes --steps "$steps" --seed 11 --quiet \
    --metrics "$LOG/$name.jsonl" "$@" > "$LOG/$name.log" 2>&1 \
    || { tail -5 "$LOG/$name.log"; record "$name: mapp-run failed" 1; }
}

echo "== 2. models with no hand-written kernel: fused vs unfused vs CPU fp32"
for mlp in geglu sqrelu; do
  w=(--weights "$D/plans/$mlp.init.safetensors")
  run $mlp.cpu $mlp.cpu cpu $STEPS "${w[@]}"
  run $mlp.cuda-unfused $mlp.unfused cuda $STEPS "${w[@]}"
  run $mlp.cuda-fused $mlp.fused cuda $STEPS "${w[@]}"
  grep "mapp cuda fused" "$LOG/$mlp.cuda-fused.log"
  run $mlp.cuda-fused-cached $mlp.fused cuda 2 "${w[@]}"
  cached=$(grep -o "[0-9]* compiled (NVRTC[^)]*), [0-9]* from the kernel cache" "$LOG/$mlp.cuda-fused-cached.log")
  case "$cached" in "0 compiled"*) record "$mlp: second run: $cached" 0 ;;
    *) record "$mlp: second run compiled again: ${cached:-no fused log line}" 1 ;; esac
  line=$(python3 - "$LOG" "$mlp" <<'PY'
import sys
from runstats import steps, max_rel_loss_diff
log, m = sys.argv[1], sys.argv[2]
cpu, unf, fus = (steps(f"{log}/{m}.{v}.jsonl") for v in ("cpu", "cuda-unfused", "cuda-fused"))
if not (cpu and unf and fus):
    print(f"{m}: missing metrics"); sys.exit(1)
d = {"cuda unfused vs cpu": max_rel_loss_diff(cpu, unf),
     "cuda fused vs cpu": max_rel_loss_diff(cpu, fus),
     "cuda fused vs unfused": max_rel_loss_diff(unf, fus)}
ok = all(v <= 2e-2 for v in d.values()) and len(fus) == len(cpu)
print(f"{m}: {len(fus)} steps, loss {cpu[0]['loss']:.4f} -> {cpu[-1]['loss']:.4f} (cpu); max rel loss diff "
      + ", ".join(f"{k} {v:.2e}" for k, v in d.items()) + (" ok (<= 2e-2)" if ok else " FAIL (> 2e-2)"))
sys.exit(0 if ok else 1)
PY
)
  record "$line" $?
done

echo "== 3. LLaMA-style bench config: step time fused vs unfused"
for r in 1 2; do
  for v in unfused fused; do
    run llama.$v.r$r llama-1b.$v cuda 10
  done
done
grep "mapp cuda fused" "$LOG/llama.fused.r1.log"
line=$(python3 - "$LOG" <<'PY'
import glob, sys
from runstats import steps, median_step_ms, max_rel_loss_diff
log = sys.argv[1]
runs = {v: [steps(p) for p in sorted(glob.glob(f"{log}/llama.{v}.r*.jsonl"))] for v in ("unfused", "fused")}
if not all(r and r[0] for r in runs.values()):
    print("llama-1b: no metrics"); sys.exit(1)
t0, t1 = median_step_ms(*runs["unfused"]), median_step_ms(*runs["fused"])
diff = max_rel_loss_diff(runs["unfused"][0], runs["fused"][0])
ok = diff <= 2e-2
print(f"llama-1b: unfused {t0:.1f} ms/step, fused {t1:.1f} ms/step ({t0 / t1:.3f}x); "
      f"max rel loss diff {diff:.2e} {'ok' if ok else 'FAIL (> 2e-2)'}")
sys.exit(0 if ok else 1)
PY
)
record "$line" $?
finish fuse_gen

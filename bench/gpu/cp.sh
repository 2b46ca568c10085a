#!/usr/bin/env bash
# Context parallelism on one GPU (issue 40, docs/context-parallel.md, "On the
# GPU"): a LLaMA-style model (8 layers, hidden 2048, 32 query heads and 8
# key/value heads of 64, SwiGLU 5632, RoPE base 500000, byte vocabulary) at
# sequence 32,768, micro-batch 1, bf16 storage: cp=1 against cp=4 with
# cp-comm=a2a (four rank threads sharing the GPU, --comm=local), from the
# same seed over the same rows. Prints the losses side by side, the worst
# relative loss difference (bf16 tolerance 2e-2), median step time, tokens/s
# and peak device memory (all ranks: the device-wide figure). RING=1 adds
# cp=4 cp-comm=ring with MAPP_CUDA_CP_RING=device (the opt-in device ring;
# the default ring runs its attention on the host: hopeless at 32k).
# From the repository root on the GPU machine, with the CUDA build in
# build/bin (MAPP_BIN overrides; SEQ and LAYERS override the shape):
#   bench/gpu/cp.sh [STEPS]
# A GPU machine without mapp-opt's LLVM takes plans compiled beforehand on
# the development machine (same SEQ, LAYERS, RING):
#   bench/gpu/cp.sh --prepare DIR            (here: compiles, runs nothing)
#   bench/gpu/cp.sh --plans DIR [STEPS]      (there: only mapp-run)
set -uo pipefail
BIN=${MAPP_BIN:-build/bin}
MODE=all
PLANS=
case "${1:-}" in
  --prepare) MODE=prepare; PLANS=${2:?--prepare DIR}; shift 2 ;;
  --plans) MODE=run; PLANS=${2:?--plans DIR}; shift 2 ;;
esac
STEPS=${1:-10}
SEQ=${SEQ:-32768}
LAYERS=${LAYERS:-8}
LOG=${LOG:-/tmp/mapp-log}/cp
mkdir -p "$LOG"
PLANS=${PLANS:-$LOG}
mkdir -p "$PLANS"
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
NEED="mapp-opt mapp-translate mapp-run"
[ $MODE = prepare ] && NEED="mapp-opt mapp-translate"
[ $MODE = run ] && NEED="mapp-run"
for b in $NEED; do
  [ -x "$BIN/$b" ] || { echo "cp.sh: $BIN/$b is not built"; exit 2; }
done
RUNS=("cp1:microbatches=1" "cp4-a2a:cp=4 cp-comm=a2a microbatches=1")
[ "${RING:-0}" = 1 ] && RUNS+=("cp4-ring:cp=4 cp-comm=ring microbatches=1")
OPT="optimizer=adamw lr=1e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1 max-grad-norm=1.0"
if [ $MODE != run ]; then
  cat > "$PLANS/cfg.json" <<EOF
{"variant": "llama", "num_layers": $LAYERS, "hidden_size": 2048,
 "num_attention_heads": 32, "num_query_groups": 8, "ffn_hidden_size": 5632,
 "seq_length": $SEQ, "vocab_size": 256, "rotary_base": 500000.0,
 "micro_batch_size": 1, "tie_embeddings": false}
EOF
  "$BIN/mapp-translate" --import-gpt-config "$PLANS/cfg.json" -o "$PLANS/m.mlir" || exit 1
  for run in "${RUNS[@]}"; do
    name=${run%%:*}
    opts=${run#*:}
    "$BIN/mapp-opt" "$PLANS/m.mlir" "--mapp-train-pipeline=$opts $OPT" \
      -mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false \
      -o "$PLANS/$name.mlir" 2> "$PLANS/$name.compile.log" || { cat "$PLANS/$name.compile.log"; exit 1; }
    "$BIN/mapp-translate" --mapp-to-plan "$PLANS/$name.mlir" -o "$PLANS/$name.mplan" || exit 1
    rm -f "$PLANS/$name.mlir"
  done
  [ $MODE = prepare ] && { ls -l "$PLANS"; exit 0; }
fi
FAILED=0
for run in "${RUNS[@]}"; do
  name=${run%%:*}
  [ -f "$PLANS/$name.mplan" ] || { echo "cp.sh: no $PLANS/$name.mplan (--prepare DIR writes it)"; exit 2; }
  grep -o "memory plan, stage 0: peak [0-9]* B ([0-9.]* MiB)" "$PLANS/$name.compile.log" 2>/dev/null | sed "s/^/$name per rank: /"
  rm -f "$LOG/$name.jsonl"
  start=$(date +%s)
  MAPP_CUDA_CP_RING=device MAPP_CUDNN_VERBOSE=1 timeout 300 "$BIN/mapp-run" "$PLANS/$name.mplan" \
    --backend=cuda --comm=local --data data/gpt/news-1k.jsonl --tokenizer bytes \
    --steps "$STEPS" --seed 7 --metrics "$LOG/$name.jsonl" --quiet > "$LOG/$name.log" 2>&1
  rc=$?
  echo "$name: mapp-run exit $rc in $(( $(date +%s) - start )) s (log $LOG/$name.log)"
  [ $rc -eq 0 ] || { tail -5 "$LOG/$name.log"; FAILED=1; }
  grep -m3 -i "cudnn\|warning" "$LOG/$name.log"
done
python3 - "$LOG" "$SEQ" <<'PY' || FAILED=1
import json, os, statistics, sys
log, seq = sys.argv[1], int(sys.argv[2])
runs = {}
for name in ("cp1", "cp4-a2a", "cp4-ring"):
    try:
        m = [json.loads(l) for l in open(os.path.join(log, f"{name}.jsonl"))]
    except OSError:
        continue
    peak = float("nan")
    for line in open(os.path.join(log, f"{name}.log")):
        if line.startswith("mapp-run: peak device memory"):
            peak = float(line.split()[4])
    runs[name] = (m, peak)
if "cp1" not in runs or "cp4-a2a" not in runs:
    print("cp: a run is missing")
    sys.exit(1)
ref = runs["cp1"][0]
others = [n for n in runs if n != "cp1"]
print(f"\n================ cp on one GPU, LLaMA-style, sequence {seq} (bf16)")
print("step   loss cp1   " + "".join(f"  loss {n:9s} rel diff" for n in others))
worst = {n: 0.0 for n in others}
for i, a in enumerate(ref):
    line = f"{a['step']:4d}  {a['loss']:9.6f}"
    for n in others:
        m = runs[n][0]
        if i < len(m):
            d = abs(a["loss"] - m[i]["loss"]) / abs(a["loss"])
            worst[n] = max(worst[n], d)
            line += f"  {m[i]['loss']:14.6f} {d:8.1e}"
    print(line)
print(f"loss cp1 from {ref[0]['loss']:.4f} to {ref[-1]['loss']:.4f}")
for n in others:
    print(f"{n}: worst relative loss difference {worst[n]:.2e} (bf16 tolerance 2e-2)")
for name, (m, peak) in runs.items():
    ms = statistics.median(x["step_ms"] for x in (m[2:] or m))
    print(f"{name:8s} median step {ms:9.1f} ms  {seq / ms:8.2f}k tok/s  "
          f"peak device memory {peak:6.2f} GiB")
ok = all(len(runs[n][0]) == len(ref) and worst[n] <= 2e-2 for n in others)
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
exit $FAILED

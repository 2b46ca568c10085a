#!/usr/bin/env bash
# Issue 37's step-64 departure (docs/benchmarks.md, ninth and tenth
# sessions): the 124M constant-lr curve trained 64 steps from the
# reference's initial weights, once per run in RUNS, then batch 64's two rows
# (one-row text files, a micro-batch-1 plan) scored from each run's
# parameters on the CUDA backend and, with SCORE_CPU=1, on the CPU backend;
# each run's update reduced to per-tensor sketches (param_sketch.py) in
# $OUT/<run>.sketch.pt, to compare with a run made elsewhere:
#   param_sketch.py compare OUT/cuda.sketch.pt cpu.sketch.pt
# RUNS (default "cuda"): cuda, cuda-nofuse (MAPP_CUDA_FUSE=0), cuda-det
# (MAPP_CUDA_DETERMINISTIC=1), cuda-f32 (MAPP_CUDA_STORAGE=f32: fp32
# activations and GEMMs, no bf16 shadows), cpu (64 CPU steps: over 280 s on the GPU
# machine's 16 cores, so on the dev VM). STEPS (default 64). PLAN (default
# mb2.mplan): sgd1.mplan (plain SGD, lr 1, no decay) with STEPS=1 makes each
# sketch the first step's gradient, negated, per tensor. PROBES=1 with a
# probed PLAN (bench/gpu/probe-all.json: every forward value and gradient,
# mean/std/absmax; `mapp-opt ... -mapp-insert-probes=spec=probe-all.json`)
# records each run's probe store $OUT/<run>.sqlite and, when RUNS holds cpu
# (listed first), names where each CUDA run parts from it
# (`python3 -m mapp.probe_diff`, THRESHOLD default 1e-4).
# The folder (gpu/step64, git-ignored; sgd1.mplan as mb2.mplan with
# -mapp-optimizer="optimizer=sgd lr=1 weight-decay=0") holds: bin/mapp-run.xz (a CUDA
# build), common.sh, e2e_check.py, param_sketch.py, the mapp package
# (python/mapp), corpus.jsonl, cfg.json (the 124M curve config at micro-
# batch 2), mb2.mplan and mb1.mplan (`mapp-opt` of that config with the
# curve's constant-lr optimizer, micro-batch 2 and 1, as prepare_fusion.sh
# builds gpt-124m.curve.fused), row0.txt and row1.txt (batch 64's rows).
D=$(cd "$(dirname "$0")" && pwd); cd "$D"
set -uo pipefail
source common.sh; with_torch_libs 2>/dev/null || true
BIN=/tmp/step64-bin; mkdir -p $BIN && rm -f $BIN/mapp-run && unpack mapp-run
R=/tmp/step64; O=${OUT:-$R}; mkdir -p $R $O
S=${STEPS:-64}
PLAN=${PLAN:-mb2.mplan}
python3 e2e_check.py init cfg.json $R/init.safetensors
run() { $BIN/mapp-run "$@" --tokenizer bytes --quiet; }
for name in ${RUNS:-cuda}; do
  env=(); be=cuda
  case $name in
    cuda) ;;
    cuda-nofuse) env=(MAPP_CUDA_FUSE=0) ;;
    cuda-det) env=(MAPP_CUDA_DETERMINISTIC=1) ;;
    cuda-f32) env=(MAPP_CUDA_STORAGE=f32) ;;
    cpu) be=cpu ;;
    *) echo "step64.sh: unknown run '$name' (cuda, cuda-nofuse, cuda-det, cuda-f32, cpu)"; exit 2 ;;
  esac
  t=$SECONDS
  rm -f $O/$name.sqlite # a store holds one run
  env "${env[@]}" $BIN/mapp-run $PLAN --tokenizer bytes --quiet --backend=$be \
    --data corpus.jsonl --steps $S --seed 11 --weights $R/init.safetensors \
    --metrics $O/$name.jsonl --save $R/$name.w.safetensors \
    ${PROBES:+--probe-db $O/$name.sqlite} > $R/$name.log 2>&1 \
    || { tail -3 $R/$name.log; echo "$name run failed"; continue; }
  echo "$name: $S steps, $((SECONDS - t)) s, last: $(tail -1 $O/$name.jsonl | cut -c1-90)"
  for score in cuda ${SCORE_CPU:+cpu}; do
    for r in 0 1; do
      run mb1.mplan --backend=$score --data row$r.txt --steps 1 --no-shuffle \
        --weights $R/$name.w.safetensors --metrics $R/row.jsonl > /dev/null 2>&1
      echo "  row $r from $name's parameters, scored on $score: $(cut -c1-60 $R/row.jsonl)"
    done
  done
  python3 param_sketch.py sketch $R/$name.w.safetensors $R/init.safetensors \
    $O/$name.sketch.pt --keep wpe.weight
done
if [ -n "${PROBES:-}" ] && [ -f $O/cpu.sqlite ]; then
  for name in ${RUNS:-cuda}; do
    [ $name = cpu ] && continue
    echo "-- $name against the CPU, point by point"
    python3 -m mapp.probe_diff $O/$name.sqlite $O/cpu.sqlite --threshold ${THRESHOLD:-1e-4} | tail -12
  done
fi

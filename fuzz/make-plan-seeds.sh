#!/usr/bin/env bash
# Writes fuzz seed plans into OUTDIR with the compiler in BINDIR (mapp-translate,
# mapp-opt) and the runtime's test-plan writer (mapp-make-test-plan), each
# when present. Usage: fuzz/make-plan-seeds.sh BINDIR OUTDIR
set -uo pipefail
bin=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
n=0
seed() { # NAME CONFIG MAPP-OPT-ARGS...
  local name=$1 cfg=$2
  shift 2
  if "$bin/mapp-translate" --import-gpt-config "$cfg" |
     "$bin/mapp-opt" "$@" 2>/dev/null |
     "$bin/mapp-translate" --mapp-to-plan -o "$out/$name.mplan"; then
    n=$((n + 1))
  else
    echo "make-plan-seeds: skipped $name" >&2
  fi
}
if [ -x "$bin/mapp-translate" ] && [ -x "$bin/mapp-opt" ]; then
  s=$here/seeds
  seed gpt-micro "$s/gpt-micro.json" -mapp-autodiff -mapp-optimizer
  seed gpt-micro-sgd "$s/gpt-micro.json" -mapp-autodiff \
    "-mapp-optimizer=optimizer=sgd momentum=0.9 max-grad-norm=1.0" -mapp-plan-memory
  seed gpt-micro-dropout "$s/gpt-micro-dropout.json" -mapp-autodiff \
    "-mapp-optimizer=lr-schedule=cosine warmup=2 total-steps=10"
  seed llama-micro "$s/llama-micro.json" -mapp-autodiff -mapp-optimizer -mapp-plan-memory
  seed gpt-micro-bf16 "$s/gpt-micro.json" -mapp-autodiff -mapp-optimizer \
    -mapp-plan-memory=activation-storage=bf16
  seed gpt-tiny "$here/../examples/gpt-tiny.json" -mapp-autodiff -mapp-optimizer
fi
if [ -x "$bin/mapp-make-test-plan" ]; then
  "$bin/mapp-make-test-plan" "$out/mlp-adamw.mplan" optimizer=adamw microbatches=2 max_grad_norm=1 && n=$((n + 1))
  "$bin/mapp-make-test-plan" "$out/mlp-sgd.mplan" optimizer=sgd schedule=cosine && n=$((n + 1))
fi
echo "make-plan-seeds: $n plans in $out"

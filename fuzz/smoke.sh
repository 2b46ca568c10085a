#!/usr/bin/env bash
# ctest smoke run of one fuzz driver: fixed seed, a few seconds, artifacts in
# WORKDIR; also the seeds of a long run (fuzz/README in docs/reliability.md).
# Usage: fuzz/smoke.sh KIND DRIVER BINDIR WORKDIR SECONDS [EXTRA-ARGS...]
#   KIND: plan | trace | safetensors | manifest | data | tokenizer | probespec
#         | scope
# BINDIR holds the normal build's tools (the compiler's, when built, write
# plan seeds and the probe store of the scope driver).
set -euo pipefail
kind=$1 driver=$2 bin=$3 work=$4 secs=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
src=$here/..
rm -rf "$work" && mkdir -p "$work"
common=(--time "$secs" --seed 1 --artifact-prefix "$work/")

# A probe store written by mapp-run (the scope driver's seed).
make_store() { # OUT.sqlite
  local s=$src/test/Transforms/Scope/Inputs
  "$bin/mapp-translate" --import-gpt-config "$s/tiny.json" |
    "$bin/mapp-opt" -mapp-autodiff -mapp-optimizer \
      "-mapp-insert-probes=spec=$s/probes.json" |
    "$bin/mapp-translate" --mapp-to-plan -o "$work/store-plan.mplan"
  "$bin/mapp-run" "$work/store-plan.mplan" --data "$src/data/gpt/news-1k.jsonl" \
    --tokenizer bytes --steps 3 --probe-db "$1" --probe-run first --quiet
}

case $kind in
plan)
  "$here/make-plan-seeds.sh" "$bin" "$work/seeds"
  exec "$driver" "${common[@]}" "$@" "$work/seeds" ;;
trace)
  exec "$driver" "${common[@]}" --work "$work/run" "$@" ;;
safetensors)
  # A GPT plan from the compiler gives Hugging Face named seeds too.
  plan=()
  if [ -x "$bin/mapp-translate" ]; then
    "$here/make-plan-seeds.sh" "$bin" "$work/seeds" > /dev/null
    [ -f "$work/seeds/gpt-micro.mplan" ] && plan=(--plan "$work/seeds/gpt-micro.mplan")
  fi
  exec "$driver" "${common[@]}" --work "$work/run" "${plan[@]}" "$@" ;;
manifest)
  exec "$driver" "${common[@]}" --work "$work/run" "$@" ;;
data)
  exec "$driver" "${common[@]}" --work "$work/run" "$@" "$src/data/gpt/news-1k.jsonl" ;;
tokenizer)
  exec "$driver" "${common[@]}" --work "$work/run" \
    --vocab "$src/data/gpt/gpt2-vocab.json" --merges "$src/data/gpt/gpt2-merges.txt" \
    --text "$src/data/gpt/news-1k.jsonl" "$@" ;;
probespec)
  mkdir -p "$work/seeds"
  cp "$src"/examples/probes.json "$src"/examples/probes.yaml "$work/seeds/"
  for f in "$src"/test/Transforms/Scope/Inputs/*.json "$src"/test/Transforms/Scope/Inputs/*.yaml; do
    cp "$f" "$work/seeds/test-$(basename "$f")"
  done
  exec "$driver" "${common[@]}" "$@" "$work/seeds" ;;
scope)
  make_store "$work/store.sqlite"
  exec "$driver" "${common[@]}" --work "$work/run" --db "$work/store.sqlite" "$@" ;;
*)
  echo "smoke.sh: unknown kind '$kind'" >&2
  exit 2 ;;
esac

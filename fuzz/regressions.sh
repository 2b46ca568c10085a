#!/usr/bin/env bash
# Inputs that once crashed a tool (fuzz/regressions/*/README.md) must now be
# clean errors (mapp-scan: exit status 1, never a signal) or clean runs.
# Usage: fuzz/regressions.sh BINDIR
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
fail=0
check() { # WHAT STATUS
  if [ "$2" -ne 1 ]; then
    echo "FAIL: $1: exit status $2 (want 1)"
    fail=1
  else
    echo "ok: $1"
  fi
}
if [ -x "$bin/mapp-scan" ]; then
  for d in "$here"/regressions/trace/*/; do
    "$bin/mapp-scan" "$d" -q > /dev/null 2>&1
    rc=$?
    check "mapp-scan $(basename "$d")" $rc
  done
fi
# Plans go through the fuzz driver's --repro: loader, verifier and (when
# they verify) two executor steps with in-range random tokens; exit 0 means
# every outcome was a clean error or a clean run.
if [ -x "$bin/mapp-fuzz-plan" ]; then
  for p in "$here"/regressions/plan/*.mplan; do
    [ -e "$p" ] || continue
    out=$("$bin/mapp-fuzz-plan" --repro --watchdog 60 "$p" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "FAIL: mapp-fuzz-plan --repro $(basename "$p"): exit status $rc"
      echo "$out" | tail -5
      fail=1
    else
      echo "ok: ${out#"$here"/regressions/plan/}"
    fi
  done
fi
# The file-format drivers' inputs (regressions/KIND/*): --repro runs each
# through the library and exits 0 when every outcome was a clean error or a
# clean run (non-zero: a crash, a wrong answer, the memory cap, or an
# exception that is not the library's error).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
make_store() { # OUT.sqlite: as fuzz/smoke.sh's scope seed
  local s=$here/../test/Transforms/Scope/Inputs
  "$bin/mapp-translate" --import-gpt-config "$s/tiny.json" |
    "$bin/mapp-opt" -mapp-autodiff -mapp-optimizer \
      "-mapp-insert-probes=spec=$s/probes.json" |
    "$bin/mapp-translate" --mapp-to-plan -o "$work/store-plan.mplan"
  "$bin/mapp-run" "$work/store-plan.mplan" --data "$here/../data/gpt/news-1k.jsonl" \
    --tokenizer bytes --steps 3 --probe-db "$1" --probe-run first --quiet
}
for kind in safetensors data tokenizer probespec scope; do
  drv=$bin/mapp-fuzz-$kind
  [ -x "$drv" ] || continue
  for f in "$here"/regressions/$kind/*; do
    [ -f "$f" ] || continue
    case $f in *.md) continue ;; esac
    extra=()
    [ "$kind" = probespec ] || extra=(--work "$work/$kind")
    if [ "$kind" = scope ]; then
      # Its inputs edit a store mapp-run writes (the compiler makes the plan).
      [ -x "$bin/mapp-translate" ] && [ -x "$bin/mapp-run" ] || continue
      [ -f "$work/store.sqlite" ] || make_store "$work/store.sqlite" > /dev/null
      extra+=(--db "$work/store.sqlite")
    fi
    out=$("$drv" --repro --watchdog 60 --artifact-prefix "$work/" "${extra[@]}" "$f" 2>&1)
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "FAIL: mapp-fuzz-$kind --repro $(basename "$f"): exit status $rc"
      echo "$out" | tail -5
      fail=1
    else
      echo "ok: ${out#"$here"/regressions/}"
    fi
  done
done
exit $fail

#!/usr/bin/env bash
# Inputs that once crashed a tool (fuzz/regressions/*/README.md) must now be
# clean errors: exit status 1 and one line on stderr, never a signal.
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
if [ -x "$bin/mapp-run" ]; then
  for p in "$here"/regressions/plan/*.mplan; do
    [ -e "$p" ] || continue
    "$bin/mapp-run" "$p" --data "$here/../data/gpt/news-1k.jsonl" --tokenizer bytes \
      --steps 1 --threads 1 --quiet > /dev/null 2>&1
    rc=$?
    check "mapp-run $(basename "$p")" $rc
  done
fi
exit $fail

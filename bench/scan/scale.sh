#!/usr/bin/env bash
# mapp-scan at scale: simulates a 1024-rank job (scale-1024.json: tp 8, pp 8,
# dp 16, 2 steps, one slow rank and one slow link injected) with mapp-sim,
# then times mapp-scan's full analysis (read, match, align, diagnose, text
# summary and report.json) on it. Goal: <= 10 s. Checks that both injected
# faults are found.
#
#   bench/scan/scale.sh [CONFIG.json]      env: BIN (build/bin), RUNS (3),
#                                               WORK (a temp dir, removed)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
RUNS=${RUNS:-3}
CONFIG=${1:-bench/scan/scale-1024.json}
keep=${WORK:+1}
WORK=${WORK:-$(mktemp -d)}
[ -n "$keep" ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"

t0=$(date +%s.%N)
"$BIN/mapp-sim" --config "$CONFIG" -o "$WORK/traces" -q
t1=$(date +%s.%N)
files=$(ls "$WORK/traces"/rank-*.trace.jsonl | wc -l)
size=$(du -sm "$WORK/traces" | cut -f1)
events=$(cat "$WORK/traces"/rank-*.trace.jsonl | grep -c '"cat"' || true)
echo "traces: $files ranks, $events events, ${size} MiB (mapp-sim $(printf '%.1f' "$(echo "$t1 - $t0" | bc)") s)"

best=
for i in $(seq "$RUNS"); do
  /usr/bin/time -f '%e %U %S %M' -o "$WORK/time" \
    "$BIN/mapp-scan" "$WORK/traces" --report "$WORK/report.json" > "$WORK/summary.txt"
  read -r wall user sys rss < "$WORK/time"
  echo "run $i: wall ${wall} s, user ${user} s, sys ${sys} s, max RSS $((rss / 1024)) MiB"
  if [ -z "$best" ] || [ "$(echo "$wall < $best" | bc)" = 1 ]; then best=$wall; fi
done
cat "$WORK/summary.txt"
grep -q 'finding: slow-rank rank=517' "$WORK/summary.txt" || { echo "FAIL: slow rank 517 not found"; exit 1; }
grep -q 'finding: slow-link src=200 dst=328' "$WORK/summary.txt" || { echo "FAIL: slow link 200->328 not found"; exit 1; }
echo "best wall: ${best} s (goal <= 10 s): $([ "$(echo "$best <= 10" | bc)" = 1 ] && echo met || echo NOT met)"

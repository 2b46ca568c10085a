#!/usr/bin/env bash
# Reshape aliasing on the CUDA backend (issue #6): the 124M and 1.3B bench
# plans as compiled (reshapes are views: `alias`, no copy) against the same
# plans built with --mapp-plan-copy-reshapes (every reshape copies), run
# interleaved with the same seed and batches, from the folder
# bench/gpu/prepare.sh filled:
#   gpu/cuda/alias.sh [STEPS_124M] [STEPS_1B3]
# Per model: median step_ms after 3 warm-up steps for both, the saving, the
# memory plan's arena bytes and reshapes aliased/copied (prepare.sh), and
# the largest relative loss
# difference (reshape copies are exact, so only run-to-run noise of atomic
# kernels may differ: <= 1e-3). Prints PASS/FAIL and the figures last.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
S124=${1:-15}
S13=${2:-8}
LOG=${OUT:-/tmp/mapp-alias}
mkdir -p "$LOG"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=/tmp/mapp-cuda-bin
mkdir -p $BIN
[ -x $BIN/mapp-run ] || { xz -dc "$D/bin/mapp-run.xz" > $BIN/mapp-run && chmod +x $BIN/mapp-run; }
SUMMARY=()
FAILED=0
say() { echo "$*"; SUMMARY+=("$*"); }

for c in gpt-124m gpt-1.3b; do
  steps=$S124
  [ $c = gpt-1.3b ] && steps=$S13
  for v in copy alias; do
    plan="$D/plans/$c.mplan"
    [ $v = copy ] && plan="$D/plans/$c.copy.mplan"
    echo "== $c $v"
    timeout 240 $BIN/mapp-run "$plan" --backend=cuda --data "$D/corpus.jsonl" \
      --tokenizer bytes --steps "$steps" --seed 11 --quiet \
      --metrics "$LOG/$c.$v.jsonl" > "$LOG/$c.$v.log" 2>&1 \
      || { tail -3 "$LOG/$c.$v.log"; say "$c $v: mapp-run failed"; FAILED=1; }
  done
  line=$(python3 - "$LOG" "$c" "$D/plans/$c.alias-stats.txt" <<'PY'
import json, statistics, sys
log, c, stats = sys.argv[1:4]
def metrics(v):
    try:
        m = [json.loads(l) for l in open(f"{log}/{c}.{v}.jsonl") if l.strip()]
    except OSError:
        return []
    return [x for x in m if "step_ms" in x]
mc, ma = metrics("copy"), metrics("alias")
if not mc or not ma:
    print(f"{c}: no metrics"); sys.exit(1)
tc = statistics.median(x["step_ms"] for x in mc[3:] or mc)
ta = statistics.median(x["step_ms"] for x in ma[3:] or ma)
diff = max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12)
           for a, b in zip(mc, ma))
ok = diff <= 1e-3 and len(mc) == len(ma)
print(f"{c}: copy {tc:.1f} ms/step, alias {ta:.1f} ms/step, saved "
      f"{tc - ta:.1f} ms ({(tc - ta) / tc:.1%}); {open(stats).read().strip()}; "
      f"max rel loss diff {diff:.2e} over {len(ma)} steps "
      f"{'ok' if ok else 'FAIL (> 1e-3)'}")
sys.exit(0 if ok else 1)
PY
)
  rc=$?
  say "$line"
  [ $rc -ne 0 ] && FAILED=1
done

echo
echo "================ alias summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader))"
printf '%s\n' "${SUMMARY[@]}"
[ $FAILED -eq 0 ] && echo "PASS" || echo "FAIL"
exit $FAILED

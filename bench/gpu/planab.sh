#!/usr/bin/env bash
# Plan-level optimizations on the CUDA backend (issue #6), each as an A/B of
# the 124M and 1.3B bench plans as compiled (`base`) against the same plans
# compiled without it, run interleaved with the same seed and batches, from
# the folder bench/gpu/prepare.sh filled:
#   gpu/cuda/planab.sh [STEPS_124M] [STEPS_1B3] [VARIANTS]
# Variants (default all): copy (--mapp-plan-copy-reshapes: every reshape
# copies instead of being a view), noconcat (-mapp-autodiff
# concat-slice-grads=false: the qkv gradient as slice_grads + adds),
# f32arena (no activation-storage=bf16: fp32-sized arena slots), saveact
# (no --mapp-recompute=policy=activations: the GELU outputs saved).
# Per model and variant: median step_ms after 3 warm-up steps for both, the
# saving, peak device memory (mapp-run's), the memory plan's figures
# (prepare.sh) and the largest relative loss difference (all four are
# exact rewrites, so only run-to-run noise of atomic kernels may differ:
# <= 1e-3). Prints PASS/FAIL and the figures last.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
S124=${1:-15}
S13=${2:-8}
VARIANTS=${3:-copy noconcat f32arena saveact}
LOG=${OUT:-/tmp/mapp-planab}
mkdir -p "$LOG"
export PYTHONPATH=$D${PYTHONPATH:+:$PYTHONPATH} # runstats.py
source "$D/common.sh"
unpack mapp-run

for c in gpt-124m gpt-1.3b; do
  steps=$S124
  [ $c = gpt-1.3b ] && steps=$S13
  for v in $VARIANTS; do
    for run in $v base; do
      plan="$D/plans/$c.mplan"
      [ $run = base ] || plan="$D/plans/$c.$run.mplan"
      echo "== $c $run (vs $v)"
      timeout 240 $BIN/mapp-run "$plan" --backend=cuda --data "$D/corpus.jsonl" \
        --tokenizer bytes --steps "$steps" --seed 11 --quiet \
        --metrics "$LOG/$c.$v.$run.jsonl" > "$LOG/$c.$v.$run.log" 2>&1 \
        || { tail -3 "$LOG/$c.$v.$run.log"; record "$c $run: mapp-run failed" 1; }
    done
    line=$(python3 - "$LOG" "$c" "$v" "$D/plans" <<'PY'
import re, sys
from runstats import steps, median_step_ms, max_rel_loss_diff
log, c, v, plans = sys.argv[1:5]
def metrics(run):
    return steps(f"{log}/{c}.{v}.{run}.jsonl")
def peak(run):
    t = open(f"{log}/{c}.{v}.{run}.log").read()
    m = re.findall(r"peak device memory ([0-9.]+) GiB", t)
    return f"{m[-1]} GiB" if m else "?"
def stats(run):
    try:
        return open(f"{plans}/{c}.{run}.stats.txt").read().strip()
    except OSError:
        return "?"
mv, mb = metrics(v), metrics("base")
if not mv or not mb:
    print(f"{c} {v}: no metrics"); sys.exit(1)
tv, tb = median_step_ms(mv), median_step_ms(mb)
diff = max_rel_loss_diff(mv, mb)
ok = diff <= 1e-3 and len(mv) == len(mb)
print(f"{c}: {v} {tv:.1f} ms/step, {peak(v)} [{stats(v)}]; base {tb:.1f} "
      f"ms/step, {peak('base')} [{stats('base')}]; saved {tv - tb:.1f} ms "
      f"({(tv - tb) / tv:.1%}); max rel loss diff {diff:.2e} over {len(mb)} "
      f"steps {'ok' if ok else 'FAIL (> 1e-3)'}")
sys.exit(0 if ok else 1)
PY
)
    record "$line" $?
  done
done
finish "plan A/B"

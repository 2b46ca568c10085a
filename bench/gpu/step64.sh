#!/usr/bin/env bash
# Issue 37's step-64 departure (docs/benchmarks.md, ninth session): the 124M
# constant-lr curve, 64 steps on the GPU and on the CPU from the same initial
# weights; then each backend's loss on batch 64's two rows (one-row text
# files, micro-batch-1 plan) from each backend's parameters, and the two
# parameter sets compared tensor by tensor. STEPS (default 64), BACKENDS.
D=$(cd "$(dirname "$0")" && pwd); cd "$D"
set -uo pipefail
source common.sh; with_torch_libs 2>/dev/null || true
BIN=/tmp/step64-bin; mkdir -p $BIN && rm -f $BIN/mapp-run && unpack mapp-run
R=${OUT:-/tmp/step64}; mkdir -p $R
S=${STEPS:-64}
python3 e2e_check.py init cfg.json $R/init.safetensors
run() { $BIN/mapp-run "$@" --tokenizer bytes --quiet; }
for be in ${BACKENDS:-cuda cpu}; do
  t=$SECONDS
  run mb2.mplan --backend=$be --data corpus.jsonl --steps $S --seed 11 \
    --weights $R/init.safetensors --metrics $R/$be.jsonl --save $R/$be.w.safetensors \
    > $R/$be.log 2>&1 || { tail -3 $R/$be.log; echo "$be run failed"; }
  echo "$be: $S steps, $((SECONDS - t)) s, last: $(tail -1 $R/$be.jsonl | cut -c1-90)"
done
for w in ${BACKENDS:-cuda cpu}; do
  for be in ${BACKENDS:-cuda cpu}; do
    for r in 0 1; do
      for fuse in 1 0; do
        [ $be = cpu ] && [ $fuse = 0 ] && continue
        MAPP_CUDA_FUSE=$fuse run mb1.mplan --backend=$be --data row$r.txt --steps 1 --no-shuffle \
          --weights $R/$w.w.safetensors --metrics $R/row.jsonl > /dev/null 2>&1
        echo "row $r, $w's parameters, on $be (fuse=$fuse): $(cut -c1-60 $R/row.jsonl)"
      done
    done
  done
done
[ -f $R/cuda.w.safetensors ] && [ -f $R/cpu.w.safetensors ] && python3 - $R <<'PY'
import sys
from mapp import safetensors
a = safetensors.load(sys.argv[1] + "/cuda.w.safetensors")[0]
b = safetensors.load(sys.argv[1] + "/cpu.w.safetensors")[0]
rows = []
for k in a:
    d = (a[k].double() - b[k].double()).norm() / b[k].double().norm().clamp_min(1e-30)
    rows.append((float(d), k))
for d, k in sorted(rows)[::-1][:12]:
    print(f"{d:.3e} {k}")
e = (a["wte.weight"] - b["wte.weight"]).double()
print("wte rows >= 256: %.3e, < 256: %.3e" % (float(e[256:].norm() / b["wte.weight"][256:].double().norm()),
      float(e[:256].norm() / b["wte.weight"][:256].double().norm())))
PY

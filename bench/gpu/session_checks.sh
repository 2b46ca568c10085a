#!/bin/bash
# One GPU call: issue 35 determinism (kernel test, graph check), 37 generated
# kernels (fuse_gen), 36 CUDA calibration; summaries into $OUT. Run from
# the repo root on the device with gpu/cuda/bin, gpu/fg, gpu/gc carried
# (prepared as docs/benchmarks.md, "Device calls of 2026-12-06, third
# session", says).
set -u
cd "$(dirname "$0")/../.."
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
R=$OUT
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee $R/card.txt
xz -dc gpu/cuda/bin/mapp-cuda-kernel-test.xz > /tmp/kt && chmod +x /tmp/kt
xz -dc gpu/cuda/bin/mapp-run.xz > /tmp/mr && chmod +x /tmp/mr
t=$SECONDS; MAPP_CUDA_DETERMINISTIC=1 timeout 100 /tmp/kt > /tmp/kt-det.log 2>&1; rc=$?
{ echo "kernel test MAPP_CUDA_DETERMINISTIC=1 rc=$rc ($((SECONDS-t)) s)"; grep -iE "fail|mismatch" /tmp/kt-det.log | head -20; tail -3 /tmp/kt-det.log; } | tee $R/kt.txt
t=$SECONDS; OUT=/tmp/gcl timeout 170 bash bench/gpu/graph_check.sh --plans gpu/gc > /tmp/gc.log 2>&1; rc=$?
{ echo "graph_check rc=$rc ($((SECONDS-t)) s)"; grep -E "PASS|FAIL|ratio|median" /tmp/gc.log | tail -30; } | tee $R/gc.txt
t=$SECONDS; OUT=/tmp/fgl timeout 180 bash gpu/fg/fuse_gen.sh --plans gpu/fg > /tmp/fg.log 2>&1; rc=$?
{ echo "fuse_gen rc=$rc ($((SECONDS-t)) s)"; tail -40 /tmp/fg.log; } | tee $R/fg.txt
t=$SECONDS; timeout 70 /tmp/mr --calibrate --backend cuda -o $R/calib-cuda.json > /tmp/cal.log 2>&1; rc=$?
{ echo "calibrate cuda rc=$rc ($((SECONDS-t)) s)"; tail -20 /tmp/cal.log; } | tee $R/cal.txt

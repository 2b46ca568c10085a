#!/usr/bin/env bash
# One device call over the folder bench/gpu/prepare_fusion.sh filled
# (issues 35 and 37): the CUDA kernel test (every kernel against the CPU
# backend and fp64, the generated pointwise kernels included), the 100-step
# curves (curves.sh), then kernels per step against torch.compile
# (kernels.sh); each stage stops where BUDGET (seconds, default 570)
# leaves the next its share (KERNELS_S, default 330). All logs end up in
# one archive in $OUT (a call returns few files).
# STAGES picks stages (default: test curves kernels).
#   BUDGET=560 CURVE_MODELS=llama-1b FUSION_MODELS=llama-1b gpu/fusion/fusion_call.sh
D=$(cd "$(dirname "$0")" && pwd)
set -uo pipefail
source "$D/common.sh"; with_torch_libs
R=${OUT:-/tmp/fusion-call}; mkdir -p $R/logs
B=${BUDGET:-570}
left() { echo $((B - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
export MAPP_KERNEL_CACHE=${MAPP_KERNEL_CACHE:-/tmp/mapp-kcache}
STAGES=${STAGES:-test curves kernels}
stage() { [[ " $STAGES " == *" $1 "* ]]; }
if stage test; then
  BIN=/tmp/mapp-fusion-bin; mkdir -p $BIN && rm -f $BIN/mapp-cuda-kernel-test && unpack mapp-cuda-kernel-test
  s=$SECONDS; timeout 150 $BIN/mapp-cuda-kernel-test > $R/logs/kernel-test.log 2>&1; rc=$?
  echo "== mapp-cuda-kernel-test rc=$rc $((SECONDS - s)) s"; tail -1 $R/logs/kernel-test.log
  [ $rc = 0 ] || grep -iE "fail|mismatch|error" $R/logs/kernel-test.log | head -20
fi
if stage curves; then
  echo "== curves (t=$SECONDS)"
  keep=0; stage kernels && keep=${KERNELS_S:-330}
  OUT=$R/curves CURVE_MODELS="${CURVE_MODELS:-llama-1b gpt-moe-1b}" \
    timeout $(( $(left) - keep )) bash $D/curves.sh 100 2>&1 | tail -12
fi
if stage kernels; then
  echo "== kernels (t=$SECONDS)"
  OUT=$R/k NCU_ROWS="${NCU_ROWS:-fuse|norms|torch}" FUSION_MODELS="${FUSION_MODELS:-llama-1b}" \
    timeout $(left) bash $D/kernels.sh 6 2>&1 | grep -v "^==PROF==" | tail -30
fi
echo "== done t=$SECONDS"
tar -C $R -czf /tmp/fusion-call-logs.tgz . 2>/dev/null && rm -rf $R/* && mv /tmp/fusion-call-logs.tgz $R/

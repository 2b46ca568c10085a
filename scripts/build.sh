#!/usr/bin/env bash
# Configures (once) and builds everything into build/ with Ninja and ccache.
# Shows its progress: on a terminal Ninja's status line; elsewhere (a log, a
# pipe) Ninja's [N/M] lines thinned to one every 10 s and every other line
# (warnings, errors) as it comes; on both a heartbeat every 30 s
# (scripts/progress.sh), so one long compile is never a silent minute.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/progress.sh
BUILD=${MAPP_BUILD_DIR:-build}
if [ ! -f "$BUILD/build.ninja" ]; then
  announce "configure $BUILD (cmake)"
  with_heartbeat configure \
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-19/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-19/build/utils/lit/lit.py \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    "$@"
fi
announce "build $BUILD with $(nproc) jobs (a first build takes minutes: the compiler, runtime, tools and tests)"
if [ -t 1 ]; then
  with_heartbeat build cmake --build "$BUILD" -j"$(nproc)"
else
  with_heartbeat build cmake --build "$BUILD" -j"$(nproc)" | throttle_progress
fi
announce "build done"

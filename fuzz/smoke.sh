#!/usr/bin/env bash
# ctest smoke run of one fuzz driver: fixed seed, a few seconds, artifacts in
# WORKDIR. Usage: fuzz/smoke.sh plan|trace DRIVER BINDIR WORKDIR SECONDS
set -euo pipefail
kind=$1 driver=$2 bin=$3 work=$4 secs=$5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
if [ "$kind" = plan ]; then
  "$here/make-plan-seeds.sh" "$bin" "$work/seeds"
  exec "$driver" --time "$secs" --seed 1 --artifact-prefix "$work/" "$work/seeds"
else
  exec "$driver" --time "$secs" --seed 1 --artifact-prefix "$work/" --work "$work/run"
fi

#!/usr/bin/env bash
# Does this host give rank threads real cores? repartition_wall.py's
# criteria need a core per rank (4 + a few spare). On the device host of
# 2026-12-06 (16 vCPUs) its plan ran ~3x slower a step than on a 2-core VM
# (docs/benchmarks.md): this prints what decides it, in about a minute.
#   bench/elastic/host_cores.sh WORK MAPP_RUN
# WORK: repartition_wall.py --keep's folder after --prepare-only (its
# 4-4-4-4.mplan and digits.txt); MAPP_RUN: a mapp-run binary.
set -u
work=$1 run=$(realpath "$2") here=$(cd "$(dirname "$0")" && pwd)
cd "$work" || exit 2
echo "nproc $(nproc); cgroup cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"
python3 -c "import sys; sys.path.insert(0, '$here')
from repartition_wall import busy_wall
for n in (1, 4, 8, 16):
    print(f'{n:2d} processes x 1 CPU-second: {busy_wall(n, 1.0):.2f} s wall')"
one() { # label, then the command
  local label=$1; shift
  /usr/bin/time -f "%e s wall, %U s user, %S s sys" "$@" 2>/tmp/host_cores.time >/dev/null
  echo "$label: $(tail -1 /tmp/host_cores.time); step ms $(python3 -c "import json; print([round(json.loads(l)['step_ms']) for l in open('/tmp/host_cores.jsonl')])")"
}
R=("$run" 4-4-4-4.mplan --backend cpu --data digits.txt --tokenizer bytes --steps 6 --seed 3 --quiet --metrics /tmp/host_cores.jsonl)
one "4 rank threads, --threads 1" "${R[@]}" --threads 1
one "the same on one core" taskset -c 0 "${R[@]}" --threads 1
one "4 rank threads, rank 1 slow 2x" "${R[@]}" --threads 1 --inject slow-compute:rank=1,factor=2

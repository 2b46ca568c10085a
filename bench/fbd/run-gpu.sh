#!/usr/bin/env bash
# On the GPU machine, from the folder bench/fbd/prepare-gpu.sh filled: the
# all-GPU pipeline (2 CUDA ranks) against MegaFBD with the forward on CPU
# ranks and the backward on the GPU (recompute and activations), 20 steps
# each; prints every step's loss difference and the verdict (2e-2).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
RUN=/tmp/fbd-mapp-run
xz -dc "$D/mapp-run.xz" > $RUN && chmod +x $RUN
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUTD=${OUT:-/tmp}
args() { echo "$D/$1.mplan --data $D/news-1k.jsonl --tokenizer bytes --steps 20 --seed 11 --weights $D/init.safetensors --metrics $OUTD/$1.jsonl"; }
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
$RUN $(args gpu) --backend=cuda --comm=local || echo "all-GPU run FAILED"
for m in mixed-rec mixed-act; do
  # One process, rank threads; CUDA ranks stage transfers through the host.
  MAPP_CUDA_COMM=host $RUN $(args $m) --comm=local || echo "$m (local) FAILED"
  cp $OUTD/$m.jsonl $OUTD/$m-local.jsonl 2>/dev/null
  # One process per rank (needs mpirun that matches the binary's Open MPI).
  if command -v mpirun >/dev/null && $RUN --help | grep -q "local, mpi"; then
    mpirun --allow-run-as-root --oversubscribe -np 4 $RUN $(args $m) --comm=mpi \
      || echo "$m (mpi) FAILED"
    cp $OUTD/$m.jsonl $OUTD/$m-mpi.jsonl 2>/dev/null
  fi
done
python3 - "$OUTD" <<'PY'
import json, os, sys
d = sys.argv[1]
load = lambda n: [json.loads(l) for l in open(os.path.join(d, n))]
ref = load("gpu.jsonl")
for name in ("mixed-rec-local", "mixed-act-local", "mixed-rec-mpi", "mixed-act-mpi"):
    p = os.path.join(d, name + ".jsonl")
    if not os.path.exists(p):
        print(f"{name}: no metrics"); continue
    got = load(name + ".jsonl")
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(got, ref))
    ms = sum(x["step_ms"] for x in got[2:]) / max(1, len(got) - 2)
    rms = sum(x["step_ms"] for x in ref[2:]) / max(1, len(ref) - 2)
    print(f"{name}: {len(got)} steps, worst |loss - all-GPU| = {worst:.2e} "
          f"({'OK' if worst <= 2e-2 and len(got) == 20 else 'FAIL'}), "
          f"{ms:.1f} ms/step vs all-GPU {rms:.1f}")
PY

#!/usr/bin/env bash
# On the GPU machine, from the folder bench/fbd/prepare-gpu.sh filled: the
# all-GPU pipeline (2 CUDA ranks) against MegaFBD with the forward on CPU
# ranks and the backward on the GPU (recompute and activations), 20 steps
# each; prints every step's loss difference and the verdict (2e-2). Then the
# GPU memory the backward side needs when the forward runs on CPU ranks:
# pp=4 at micro-batch 8 and 16, every rank's peak allocation on the GPU
# (--report-memory) and the step time, all-GPU against forward-on-CPU.
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

# --- GPU memory with the forward on CPU ranks
memrun() { # NAME MB [FLAG...]   (MAPP_CUDA_COMM from the caller)
  local n=$1 mb=$2
  shift 2
  $RUN "$D/$n.mplan" "$@" --data "$D/news-1k.jsonl" --tokenizer bytes --steps 4 \
    --seed 11 --comm=local --report-memory \
    --metrics "$OUTD/$n.jsonl" > "$OUTD/$n.log" 2>&1 || echo "$n FAILED: $(tail -2 "$OUTD/$n.log")"
}
for mb in 8 16; do
  memrun mem-gpu-$mb $mb --backend=cuda
  MAPP_CUDA_COMM=host memrun mem-rec-$mb $mb
  MAPP_CUDA_COMM=host memrun mem-act-$mb $mb
done
python3 - "$OUTD" <<'PY'
import json, os, re, sys
d = sys.argv[1]
print("layout (pp=4, 8 microbatches, 1F1B) | micro-batch | GPU peak, sum of ranks (MiB) | max rank (MiB) | ms/step | final loss")
for mb in (8, 16):
    for lay in ("gpu", "rec", "act"):
        n = f"mem-{lay}-{mb}"
        log = open(os.path.join(d, n + ".log")).read() if os.path.exists(os.path.join(d, n + ".log")) else ""
        # placement table rows: rank role stage dp tp device peer
        dev = {int(m[0]): m[1] for m in re.findall(r"^\s+(\d+)\s+\w+\s+\d+\s+\d+\s+\d+\s+(\S+)", log, re.M)}
        peaks = {int(r): int(p) for r, p in re.findall(r"rank (\d+) memory: allocated \d+ B \(peak (\d+) B\)", log)}
        gpu = [p for r, p in peaks.items() if lay == "gpu" or dev.get(r, "").startswith(("cuda", "gpu"))]
        try:
            m = [json.loads(l) for l in open(os.path.join(d, n + ".jsonl"))]
        except OSError:
            print(f"{n}: no metrics"); continue
        ms = sum(x["step_ms"] for x in m[2:]) / max(1, len(m) - 2)
        print(f"{ {'gpu': 'all-GPU', 'rec': 'fwd CPU, recompute', 'act': 'fwd CPU, activations'}[lay]} | {mb} | "
              f"{sum(gpu) / 2**20:.1f} | {max(gpu, default=0) / 2**20:.1f} | {ms:.1f} | {m[-1]['loss']:.6f}")
PY

#!/usr/bin/env bash
# One-GPU check of NCCL processes (issue 42, docs/multi-gpu.md): a tiny GPT
# plan trains 10 steps with --comm=local (world 1), again with --comm=local
# (the backend's run-to-run noise), then as a one-process NCCL world
# (ncclCommInitRank) through each launcher and rendezvous:
#   mpi       mpirun -np 1: the id over MPI_Bcast
#   tcp       torchrun's variables, MASTER_ADDR=127.0.0.1 MASTER_PORT=free
#   file      Slurm's variables, MAPP_RENDEZVOUS_FILE (rank 0 writes it)
# Losses must be bit-identical to --comm=local (at world 1 the same kernels
# run; only the communicator's setup differs). P2P and all-to-all need a
# peer: at world 1 the CUDA backend makes no device communicator, so they
# are not exercised here (they are, on several GPUs, by bench/gpu/nccl.sh).
# With two or more GPUs visible it goes on: tp2, pp2 and dp2 plans of the
# same model as NCCL threads (one process) and as NCCL processes (mpirun -np
# 2), losses compared (the same NCCL calls: expected bit-identical, passes
# within 1e-5 relative and says which).
#
# On the development machine (has mapp-opt), from the repo root:
#   bench/gpu/nccl_procs.sh --prepare        # writes bench/gpu/nccl-procs-plans/
# On the GPU machine, from the repo root (build/bin/mapp-run, Open MPI):
#   bench/gpu/nccl_procs.sh
# Prints one PASS/FAIL line per run and "nccl_procs: ALL PASS" at the end;
# exit status 0 only then. About 30 s.
set -uo pipefail
ROOT=$(pwd)
PLANS=$ROOT/bench/gpu/nccl-procs-plans
BIN=${MAPP_BIN:-$ROOT/build/bin}
if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$PLANS"
  "$BIN/mapp-translate" --import-gpt-config "$ROOT/examples/gpt-tiny.json" \
    -o "$PLANS/gpt-tiny.mlir" || exit 1
  "$BIN/mapp-opt" "$PLANS/gpt-tiny.mlir" -mapp-autodiff -mapp-optimizer |
    "$BIN/mapp-translate" --mapp-to-plan -o "$PLANS/gpt-tiny.mplan" || exit 1
  for l in "2 1 1" "1 2 1" "1 1 2"; do
    read -r tp pp dp <<< "$l"
    "$BIN/mapp-opt" "$PLANS/gpt-tiny.mlir" \
      "--mapp-train-pipeline=tp=$tp pp=$pp dp=$dp chunks=1 microbatches=2 schedule=1f1b optimizer=adamw" 2>/dev/null |
      "$BIN/mapp-translate" --mapp-to-plan -o "$PLANS/tp${tp}pp${pp}dp${dp}.mplan" || exit 1
  done
  rm -f "$PLANS/gpt-tiny.mlir"
  echo "wrote $PLANS: $(cd "$PLANS" && ls)"
  exit 0
fi
[ -s "$PLANS/gpt-tiny.mplan" ] || { echo "FAIL: no $PLANS/gpt-tiny.mplan (run --prepare on the development machine)"; exit 1; }
OUT=$(mktemp -d /tmp/mapp-nccl-procs.XXXXXX)
# CUDA's and the pip wheels' libraries (cuDNN, NCCL), as llama.sh finds them.
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
unset OMPI_COMM_WORLD_RANK RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE SLURM_PROCID MAPP_LAUNCHER MAPP_RENDEZVOUS_FILE
FAILS=0
run() { # NAME COMM [PREFIX...]: 10 steps of $PLAN (the tiny GPT), metrics in $OUT/NAME.jsonl
  local name=$1 comm=$2; shift 2
  timeout 90 "$@" "$BIN/mapp-run" "$PLANS/${PLAN:-gpt-tiny}.mplan" --backend=cuda --comm="$comm" \
    --data "$ROOT/data/gpt/news-1k.jsonl" --tokenizer bytes --steps 10 --seed 7 \
    --metrics "$OUT/$name.jsonl" --quiet > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $name: mapp-run exited $rc"; tail -5 "$OUT/$name.log"; FAILS=$((FAILS + 1)); return 1
  fi
}
same() { # NAME: losses of NAME against local, exactly (as JSON writes them)
  python3 - "$OUT/local.jsonl" "$OUT/$1.jsonl" "$1" "$OUT/$1.log" <<'PY' || FAILS=$((FAILS + 1))
import json, sys
ref, got = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
name, log = sys.argv[3], open(sys.argv[4]).read()
how = next((l.split("): ", 1)[1] for l in log.splitlines() if "NCCL processes" in l), "")
ok = len(got) == len(ref) == 10 and got == ref and (name == "local-repeat" or how)
worst = max((abs(a - b) for a, b in zip(got, ref)), default=float("inf"))
print(f"{'PASS' if ok else 'FAIL'} {name}: {len(got)} steps, losses "
      f"{'bit-identical to' if got == ref else f'differ (max abs {worst:.3e}) from'} --comm=local"
      f"{'; ' + how if how else ''}; loss {got[0] if got else '-'} -> {got[-1] if got else '-'}")
sys.exit(0 if ok else 1)
PY
}
nvidia-smi --query-gpu=index,name --format=csv,noheader | head -1
run local local || exit 1
run local-repeat local && same local-repeat
run mpi nccl mpirun --allow-run-as-root -np 1 && same mpi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
run tcp nccl env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT && same tcp
run file nccl env SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 \
  SLURM_STEP_TASKS_PER_NODE=1 MAPP_RENDEZVOUS_FILE="$OUT/nccl-id" && same file
[ -e "$OUT/nccl-id" ] && { echo "FAIL file: $OUT/nccl-id left behind"; FAILS=$((FAILS + 1)); }
# A mismatched launcher world fails before step 1, naming both sizes.
if env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_PORT=$PORT timeout 60 \
   "$BIN/mapp-run" "$PLANS/gpt-tiny.mplan" --backend=cuda --comm=nccl --steps 1 \
   --data "$ROOT/data/gpt/news-1k.jsonl" --tokenizer bytes 2> "$OUT/mismatch.log" >/dev/null ||
   ! grep -q "the plan is for world_size 1 but torchrun started 2" "$OUT/mismatch.log"; then
  echo "FAIL mismatch: $(tail -1 "$OUT/mismatch.log")"; FAILS=$((FAILS + 1))
else
  echo "PASS mismatch: $(tail -1 "$OUT/mismatch.log")"
fi
# Several GPUs: NCCL processes against NCCL threads on the same plans.
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
if [ "${NGPU:-0}" -ge 2 ]; then
  for l in tp2pp1dp1 tp1pp2dp1 tp1pp1dp2; do
    PLAN=$l run $l-threads nccl || continue
    PLAN=$l run $l-procs nccl mpirun --allow-run-as-root -np 2 || continue
    python3 - "$OUT/$l-threads.jsonl" "$OUT/$l-procs.jsonl" "$l" "$OUT/$l-procs.log" <<'PY' || FAILS=$((FAILS + 1))
import json, sys
ref, got = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
how = next((l.split("): ", 1)[1] for l in open(sys.argv[4]).read().splitlines() if "NCCL processes" in l), "")
worst = max((abs(a - b) / abs(b) for a, b in zip(got, ref)), default=float("inf"))
ok = len(got) == len(ref) == 10 and worst <= 1e-5 and how
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]}: NCCL processes (mpirun -np 2) vs NCCL threads, "
      f"{'bit-identical' if got == ref else f'max rel loss diff {worst:.2e} (tol 1e-5)'}; {how}; "
      f"loss {got[0] if got else '-'} -> {got[-1] if got else '-'}")
sys.exit(0 if ok else 1)
PY
  done
else
  echo "SKIP several GPUs: ${NGPU:-0} visible (NCCL processes across GPUs not run)"
fi
if [ $FAILS -eq 0 ]; then echo "nccl_procs: ALL PASS"; rm -rf "$OUT"; exit 0; fi
echo "nccl_procs: $FAILS FAILED (logs in $OUT)"; exit 1

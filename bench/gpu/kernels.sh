#!/usr/bin/env bash
# Kernels per training step, mapp (unfused and --mapp-fuse) against
# torch.compile, on the GPU machine (issue 37). Runs from the folder
# bench/gpu/prepare_fusion.sh filled:
#   gpu/fusion/kernels.sh [STEPS]
# Every process runs under the CUPTI kernel census (CUDA_INJECTION64_PATH;
# kernel_census.cpp), twice: with 3 steps and with 3 + STEPS, the same
# warm-up (PyTorch after a run that fills inductor's cache); kernels.py
# takes the difference (STEPS steady steps) and sorts
# the kernels into GEMM, attention and the rest. Then, where Nsight Compute
# is installed (NCU=0 skips it; NCU_ROWS, a regex of row names, picks rows),
# one steady step of each run again under
# ncu: the run skips the 3-step run's launches and profiles the next
# step's (DRAM bytes read and written, duration per kernel), so the table
# adds bytes moved per step by class. Rows and the table in $OUT (or /tmp).
# KERNEL_PLANS picks mapp's plans (default: plain fused norms).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
BIN=/tmp/mapp-fusion-bin # this package's binary, not another's left on the machine
mapp_run() { # plan steps
  $BIN/mapp-run "$1" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes --quiet --steps "$2"; }
base_run() { # plan steps
  $BIN/mapp-run-base "$1" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes --quiet --steps "$2"; }
torch_run() { # script cfg steps: 3 warm-up steps, then steps - 2 timed (3 and 3 + S: S apart)
  python3 "$D/$1" "$2" --mode compile --warmup 3 --steps $(($3 - 2)); }
# ncu starts a program, not a shell function: it runs this script as
# `kernels.sh --exec RUNNER ARGS...`.
if [ "${1:-}" = --exec ]; then shift; "$@"; exit; fi
STEPS=${1:-6}
LOG=${OUT:-/tmp/mapp-kernels}
mkdir -p "$LOG"
source "$D/common.sh" # unpack, say, with_torch_libs
with_torch_libs
BIN=/tmp/mapp-fusion-bin # common.sh set its own; the --exec runs above use this one
mkdir -p $BIN && rm -f $BIN/mapp-run $BIN/mapp-run-base && unpack mapp-run
# A baseline mapp-run (another commit's, prepare_fusion.sh BASE_BIN=...)
# runs the unfused plans too: a row of its own, in the same call.
[ -f "$D/bin/mapp-run-base.xz" ] && unpack mapp-run-base
CENSUS=$D/bin/libmapp-kernel-census.so
ROWS=()
census() { # name steps command...
  local name=$1 n=$2; shift 2
  CUDA_INJECTION64_PATH=$CENSUS MAPP_CENSUS_OUT=$LOG/$name.$n.tsv "$@" > $LOG/$name.$n.log 2>&1 \
    || { tail -3 $LOG/$name.$n.log; echo "$name ($n steps) failed"; return 1; }
}
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
[ "${NCU:-1}" = 0 ] && NCU_BIN=
bytes() { # name command-taking-a-step-count...: one steady step under ncu
  local name=$1; shift
  local skip per
  read -r skip per < <(python3 "$D/kernels.py" --window $LOG/$name.$((3 + STEPS)).tsv $LOG/$name.3.tsv $STEPS)
  # ncu follows the processes the script starts (--target-processes all).
  "$NCU_BIN" --target-processes all --clock-control none --launch-skip "$skip" --launch-count "$per" \
    --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
    --csv --page raw --print-units base --log-file $LOG/$name.ncu.csv \
    bash "$D/kernels.sh" --exec "$@" 5 > $LOG/$name.ncu.log 2>&1 \
    || { { tail -3 $LOG/$name.ncu.log; echo "$name under ncu failed"; } >&2; return 1; }
  echo "--ncu $LOG/$name.ncu.csv"
}
pair() { # name command-taking-a-step-count...
  local name=$1; shift
  census "$name" 3 "$@" 3 && census "$name" $((3 + STEPS)) "$@" $((3 + STEPS)) || return
  local ncu=()
  [ -n "$NCU_BIN" ] && [[ $name =~ ${NCU_ROWS:-.} ]] && ncu=($(bytes "$name" "$@"))
  python3 "$D/kernels.py" $LOG/$name.$((3 + STEPS)).tsv $LOG/$name.3.tsv $STEPS --name "$name" \
    "${ncu[@]}" --json $LOG/$name.json > /dev/null && ROWS+=($LOG/$name.json)
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for c in ${FUSION_MODELS:-llama-1b gpt-moe-1b gpt-124m gpt-1.3b}; do
  t=$SECONDS
  case $c in llama*) py=torch_llama.py ;; gpt-moe*) py=torch_moe.py ;; *) py=torch_gpt.py ;; esac
  [ -x $BIN/mapp-run-base ] && pair "$c.mapp-base" base_run "$D/plans/$c.bench.plain.mplan"
  for v in ${KERNEL_PLANS:-plain fused norms}; do # row names: mapp, mapp-fuse, mapp-norms
    case $v in plain) row=mapp ;; fused) row=mapp-fuse ;; *) row=mapp-$v ;; esac
    pair "$c.$row" mapp_run "$D/plans/$c.bench.$v.mplan"
  done
  # A first run fills inductor's cache: a cold compile launches kernels
  # (its benchmarks) that the warm run of the pair would not, and the
  # difference would go negative.
  torch_run $py "$D/configs/$c.bench.json" 3 > $LOG/$c.torch-warm.log 2>&1 || tail -3 $LOG/$c.torch-warm.log
  pair "$c.torch-compile" torch_run $py "$D/configs/$c.bench.json"
  echo "$c: $((SECONDS - t)) s"
done
echo "== kernels per step ($STEPS steady steps)"
python3 "$D/kernels.py" --table "${ROWS[@]}" | tee $LOG/kernels.md
python3 "$D/kernels.py" --top "${ROWS[@]}"

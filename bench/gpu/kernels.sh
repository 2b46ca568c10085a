#!/usr/bin/env bash
# Kernels per training step, mapp (unfused and --mapp-fuse) against
# torch.compile, on the GPU machine (issue 37). Runs from the folder
# bench/gpu/prepare_fusion.sh filled:
#   gpu/fusion/kernels.sh [STEPS]
# Every process runs under the CUPTI kernel census (CUDA_INJECTION64_PATH;
# kernel_census.cpp), twice: with 3 steps and with 3 + STEPS, the same
# warm-up (PyTorch after a run that fills inductor's cache); kernels.py
# takes the difference (STEPS steady steps) and sorts
# the kernels into GEMM, attention and the rest. Rows and the table in $OUT
# (or /tmp).
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-6}
LOG=${OUT:-/tmp/mapp-kernels}
mkdir -p "$LOG"
source "$D/common.sh" # unpack, say, with_torch_libs
with_torch_libs
BIN=/tmp/mapp-fusion-bin # this package's binary, not another's left on the machine
mkdir -p $BIN && rm -f $BIN/mapp-run && unpack mapp-run
CENSUS=$D/bin/libmapp-kernel-census.so
ROWS=()
census() { # name steps command...
  local name=$1 n=$2; shift 2
  CUDA_INJECTION64_PATH=$CENSUS MAPP_CENSUS_OUT=$LOG/$name.$n.tsv "$@" > $LOG/$name.$n.log 2>&1 \
    || { tail -3 $LOG/$name.$n.log; echo "$name ($n steps) failed"; return 1; }
}
pair() { # name command-taking-a-step-count...
  local name=$1; shift
  census "$name" 3 "$@" 3 && census "$name" $((3 + STEPS)) "$@" $((3 + STEPS)) || return
  python3 "$D/kernels.py" $LOG/$name.$((3 + STEPS)).tsv $LOG/$name.3.tsv $STEPS --name "$name" \
    --json $LOG/$name.json > /dev/null && ROWS+=($LOG/$name.json)
}
mapp_run() { # plan steps
  $BIN/mapp-run "$1" --backend=cuda --data "$D/corpus.jsonl" --tokenizer bytes --quiet --steps "$2"; }
torch_run() { # script cfg steps: 3 warm-up steps, then steps - 2 timed (3 and 3 + S: S apart)
  python3 "$D/$1" "$2" --mode compile --warmup 3 --steps $(($3 - 2)); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for c in ${FUSION_MODELS:-llama-1b gpt-moe-1b gpt-124m gpt-1.3b}; do
  t=$SECONDS
  case $c in llama*) py=torch_llama.py ;; gpt-moe*) py=torch_moe.py ;; *) py=torch_gpt.py ;; esac
  pair "$c.mapp" mapp_run "$D/plans/$c.bench.plain.mplan"
  pair "$c.mapp-fuse" mapp_run "$D/plans/$c.bench.fused.mplan"
  # A first run fills inductor's cache: a cold compile launches kernels
  # (its benchmarks) that the warm run of the pair would not, and the
  # difference would go negative.
  torch_run $py "$D/configs/$c.bench.json" 3 > $LOG/$c.torch-warm.log 2>&1 || tail -3 $LOG/$c.torch-warm.log
  pair "$c.torch-compile" torch_run $py "$D/configs/$c.bench.json"
  echo "$c: $((SECONDS - t)) s"
done
echo "== kernels per step ($STEPS steady steps)"
python3 "$D/kernels.py" --table "${ROWS[@]}" | tee $LOG/kernels.md
for r in "${ROWS[@]}"; do python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print(r['name'], 'top non-GEMM:', '; '.join('%s %.2f ms x%.0f' % (k['kernel'][:50], k['ms'], k['launches']) for k in r['top_other'][:5]))" "$r"; done

# Sourced by the device-side scripts (planab.sh, fuse.sh, comm.sh,
# scope.sh) from the folder bench/gpu/prepare.sh filled: CUDA's libraries
# on the path, the binaries unpacked, and the summary each prints last.
#   D=<that folder>; source "$D/common.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=/tmp/mapp-cuda-bin
mkdir -p $BIN
SUMMARY=()
FAILED=0

# unpack NAME...: $D/bin/NAME.xz -> $BIN/NAME, once per machine.
unpack() {
  local b
  for b in "$@"; do
    [ -x $BIN/$b ] || { xz -dc "$D/bin/$b.xz" > $BIN/$b && chmod +x $BIN/$b; }
  done
}

# say TEXT: print it now and again in the summary.
say() { echo "$*"; SUMMARY+=("$*"); }

# record TEXT RC: say it; a non-zero RC fails the script.
record() {
  say "$1"
  [ "$2" -eq 0 ] || FAILED=1
}

# finish TITLE: the dated summary, PASS or FAIL, and the exit status.
finish() {
  echo
  echo "================ $1 summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null))"
  printf '%s\n' "${SUMMARY[@]}"
  [ $FAILED -eq 0 ] && echo "PASS" || echo "FAIL"
  exit $FAILED
}

# with_torch_libs: the CUDA libraries PyTorch's wheels carry (NVRTC for the
# fused kernels, cuDNN) on the library path too, and PyTorch's side of the
# folder importable.
with_torch_libs() {
  local libs
  libs=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
  export LD_LIBRARY_PATH=${libs:+$libs:}$LD_LIBRARY_PATH
  export PYTHONPATH=$D PYTHONUNBUFFERED=1
}

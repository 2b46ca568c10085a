#!/usr/bin/env bash
# The LLaMA-style benchmark (issue #35) on the GPU machine: mapp against the
# independent PyTorch model of torch_llama.py (eager and torch.compile), same
# config (configs/llama-1b.json: GQA 32/8 heads of 64, SwiGLU, RoPE, 128k
# vocabulary), median step time, tokens/s, peak memory; with PROFILE=1 also
# both profiles (MAPP_CUDA_PROFILE and torch.profiler). Runs from the folder
# bench/gpu/prepare.sh filled (plans/llama-1b.mplan):
#   gpu/cuda/llama.sh [STEPS]
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-12}
LOG=${LOG:-/tmp/mapp-log}/llama
mkdir -p "$LOG"
NVLIBS=$(python3 -c "import glob, os, nvidia; print(':'.join(sorted({d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, '*', 'lib'))})))" 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${NVLIBS:+:$NVLIBS}:${LD_LIBRARY_PATH:-}
BIN=/tmp/mapp-cuda-bin
mkdir -p $BIN
[ -x $BIN/mapp-run ] || { xz -dc "$D/bin/mapp-run.xz" > $BIN/mapp-run && chmod +x $BIN/mapp-run; }
CFG=$D/configs/llama-1b.json
MAPP_CUDNN_VERBOSE=1 $BIN/mapp-run "$D/plans/llama-1b.mplan" --backend=cuda --data "$D/corpus.jsonl" \
  --tokenizer bytes --steps "$STEPS" --metrics "$LOG/mapp.jsonl" --quiet > "$LOG/mapp.log" 2>&1 \
  || { tail -5 "$LOG/mapp.log"; echo "mapp-run failed"; }
grep -m6 "cuDNN\|cudnn" "$LOG/mapp.log"
for m in eager compile; do
  timeout 300 python3 "$D/torch_llama.py" "$CFG" --mode $m --steps "$STEPS" --warmup 3 \
    > "$LOG/torch-$m.json" 2> "$LOG/torch-$m.err" || tail -3 "$LOG/torch-$m.err"
done
if [ "${PROFILE:-0}" = 1 ]; then
  MAPP_CUDA_PROFILE=1 $BIN/mapp-run "$D/plans/llama-1b.mplan" --backend=cuda --data "$D/corpus.jsonl" \
    --tokenizer bytes --steps 4 --quiet 2> "$LOG/mapp.profile.txt" > /dev/null
  echo "== mapp profile"; head -40 "$LOG/mapp.profile.txt"
  timeout 300 python3 "$D/torch_llama.py" "$CFG" --mode compile --steps 3 --warmup 3 --profile 25 \
    2>&1 >/dev/null | tail -27
fi
python3 - "$LOG" "$CFG" <<'PY'
import json, os, statistics, sys
log, cfg = sys.argv[1], json.load(open(sys.argv[2]))
B, T = cfg["micro_batch_size"], cfg["seq_length"]
res, peak = {}, {}
try:
    m = [json.loads(l) for l in open(os.path.join(log, "mapp.jsonl"))]
    res["mapp-cuda"] = statistics.median(x["step_ms"] for x in m[3:] or m)
    for line in open(os.path.join(log, "mapp.log")):
        if line.startswith("mapp-run: peak device memory"):
            peak["mapp-cuda"] = float(line.split()[4])
except Exception as e:
    print("mapp: no result", e)
for mode in ("eager", "compile"):
    try:
        r = json.loads(open(os.path.join(log, f"torch-{mode}.json")).read().strip().splitlines()[-1])
        res[f"torch-{mode}"], peak[f"torch-{mode}"] = r["ms_per_step"], r["peak_gib"]
    except Exception:
        pass
print("\n================ llama-1b (median ms/step; x = torch time / mapp time)")
for k, ms in res.items():
    extra = ""
    if k == "mapp-cuda":
        extra = " ".join(f"{o}/mapp={v / ms:.2f}x" for o, v in res.items() if o != k)
    print(f"llama-1b {k:13s} {ms:8.1f} ms {B * T / ms:8.1f}k tok/s peak "
          f"{peak.get(k, float('nan')):5.1f} GiB {extra}")
PY

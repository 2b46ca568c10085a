#!/usr/bin/env bash
# MegaFBD on CPU ranks, side by side: unsplit tp=2 against split layouts
# (fwd-tp=1/bwd-tp=2 recompute, fwd-tp=2/bwd-tp=2 activations and
# recompute), and the coordinator on vs off. One mapp-run per layout,
# --comm=local with one thread per rank; prints mean step_ms over steps
# 3..STEPS and the final loss. Usage: bench/fbd/compare.sh [BUILD] [STEPS] [sim]
# With "sim", mapp-sim then predicts each layout's step on the same plans:
# its FLOP rate calibrated so that the unsplit plan's prediction equals its
# measured step (memory bandwidth and links made free: one host, shared
# memory), every other prediction printed against its measurement.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build}/bin
STEPS=${2:-20}
SIM=${3:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CFG='{"variant":"gpt","num_layers":4,"hidden_size":128,"num_attention_heads":4,"seq_length":64,"vocab_size":256,"micro_batch_size":4,"tie_embeddings":true}'
echo "$CFG" > "$T/cfg.json"
PYTHONPATH=$ROOT/python /usr/bin/python3 -m mapp.export --module mapp.reference:GPT \
  --config "$T/cfg.json" -o "$T/model.mlir" --weights "$T/init.safetensors" --seed 7 >/dev/null
OPT="optimizer=adamw lr=0.003 microbatches=4 schedule=1f1b"
plan() { # name pipeline-options
  "$BIN/mapp-opt" "$T/model.mlir" --mapp-train-pipeline="$2 $OPT" -o "$T/$1.mlir" 2>/dev/null
  "$BIN/mapp-translate" --mapp-to-plan "$T/$1.mlir" -o "$T/$1.mplan"
}
run() { # name extra-flags...
  local name=$1; shift
  "$BIN/mapp-run" "$T/$name.mplan" --data "$ROOT/data/gpt/news-1k.jsonl" --tokenizer bytes \
    --steps "$STEPS" --seed 11 --weights "$T/init.safetensors" --threads 1 --comm=local \
    --metrics "$T/m.jsonl" --quiet "$@" >/dev/null 2>"$T/err" || { cat "$T/err"; exit 1; }
  /usr/bin/python3 - "$T/m.jsonl" "$T/ms" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
ms = [x["step_ms"] for x in m[2:]]
print(f"{sum(ms)/len(ms):9.1f} ms/step   final loss {m[-1]['loss']:.6f}")
open(sys.argv[2], "w").write(f"{sum(ms)/len(ms):.3f}")
PY
  # The coordinator-on runs, for the prediction below.
  [ $# -gt 0 ] || OUTS="$OUTS $name=$(cat "$T/ms")"
}
OUTS=""
plan tp2pp2 "tp=2 pp=2"
plan f1b2rec "tp=2 pp=2 fbd=true fwd-tp=1 transfer=recompute"
plan f2b2rec "tp=2 pp=2 fbd=true fwd-tp=2 transfer=recompute"
plan f2b2act "tp=2 pp=2 fbd=true fwd-tp=2 transfer=activations"
printf '%-44s' "unsplit tp=2 pp=2 (4 ranks)";                 run tp2pp2
printf '%-44s' "fbd fwd-tp=1 bwd-tp=2 recompute (6 ranks)";   run f1b2rec
printf '%-44s' "fbd fwd-tp=2 bwd-tp=2 recompute (8 ranks)";   run f2b2rec
printf '%-44s' "fbd fwd-tp=2 bwd-tp=2 activations (8 ranks)"; run f2b2act
printf '%-44s' "  same, --coordinator=off";                   run f2b2act --coordinator=off
printf '%-44s' "fbd fwd-tp=1 recompute, --coordinator=off";   run f1b2rec --coordinator=off
[ "$SIM" = sim ] || exit 0
/usr/bin/python3 - "$BIN" "$T" "$OUTS" <<'PY'
import json, subprocess, sys
bin_, t, outs = sys.argv[1], sys.argv[2], sys.argv[3].split()
free = ["--mem-gbps", "1e9", "--gbps", "1e6", "--latency-us", "0",
        "--intra-gbps", "1e6", "--intra-latency-us", "0", "--steps", "2"]
def predict(name, tflops, *extra):
    out = subprocess.run([f"{bin_}/mapp-sim", f"{t}/{name}.mplan", "--json",
                          "--tflops", str(tflops), *free, *extra],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)[0]
    return r["step_us"] / 1000, len(r["peak_bytes"])
rows = [o.split("=") for o in outs]
measured = {n: float(ms) for n, ms in rows}
# Compute scales as 1/tflops with free memory and links: one calibration.
base, world0 = predict("tp2pp2", 1.0)
tflops = base / measured["tp2pp2"]
print(f"mapp-sim, calibrated on the unsplit plan: {tflops * 1e3:.2f} GFLOP/s per rank;"
      f" 'shared': the split plans' CPU ranks at {world0}/ranks of that (more rank"
      f" threads on the same cores)")
for n, _ in rows:
    p, world = predict(n, tflops)
    q, _ = predict(n, tflops, "--device-speed", f"cpu={world0 / world}")
    print(f"  {n:10} measured {measured[n]:8.1f} ms  predicted {p:8.1f} ms"
          f" ({100 * (p / measured[n] - 1):+6.1f}%), shared {q:8.1f} ms"
          f" ({100 * (q / measured[n] - 1):+6.1f}%)")
PY
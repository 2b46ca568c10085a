#!/usr/bin/env bash
# The auto-parallel search on one H200 (issue 36): for the 1.3B GPT
# (bench/gpu/configs/gpt-1.3b.json) and a LLaMA-style 1B with GQA and SwiGLU
# (bench/autopar/llama-1b.json), global batch 16 sequences of 2048, the
# search chooses micro-batch size, recomputation and activation storage
# under caps of 30 GiB, 50 GiB and the whole card; every candidate of the
# caps' rankings (the top 6 of each, their union) is measured side by side.
#
# Development machine (after bench/gpu/prepare.sh filled OUT with the CUDA
# mapp-run, common.sh and the corpus; mapp-opt/mapp-translate from
# $MAPP_BIN, default build/bin):
#   bench/autopar/gpu.sh --prepare OUT
#     writes OUT/plans/autopar/<model>/<candidate>.mplan, each cap's ranking
#     (<model>.cap<G>.txt, .json) and copies this script to OUT/autopar-gpu.sh
# Device (the folder OUT):
#   OUT/autopar-gpu.sh [STEPS]          (default 8 steps a run)
#   BACKEND=cpu MAPP_RUN=build/bin/mapp-run OUT/autopar-gpu.sh 5   (dry run; the
#   median skips 3 warm-up steps)
# Prints per model and candidate: median ms/step after 3 warm-up steps and
# the peak device memory; then per cap: the search's choice, the best
# measured candidate that stayed under the cap, choice/best - 1 (issue 36:
# within 5%) and whether the choice ran out of memory (it must not).
# PASS/FAIL last.
set -uo pipefail

# AUTOPAR_MODELS / AUTOPAR_CAPS / AUTOPAR_BATCH / AUTOPAR_CLUSTER override
# them for a dry run with a small model (prepare and run must agree).
MODELS=${AUTOPAR_MODELS:-"gpt-1.3b:bench/gpu/configs/gpt-1.3b.json llama-1b:bench/autopar/llama-1b.json"}
CAPS=${AUTOPAR_CAPS:-"30 50 0"} # GiB; 0 = the whole card
BATCH=${AUTOPAR_BATCH:-16}
# The whole card is the card the plans run on, which is known only there:
# cap 0 is ranked once per card kind here (cap0-<kind>.json) and the run
# judges the ranking of the card it finds (nvidia-smi's memory: under 100
# GiB an H100). On 2026-12-05 the one H200 ranking ran on an H100 and its
# choice ran out of memory.
CARDS=${AUTOPAR_CARDS:-"h100:bench/autopar/scale/h100-single.json h200:bench/autopar/scale/h200-single.json"}
# The search reads a measured profile, as a user's would: `mapp-run
# --calibrate --backend cuda` on an H100 (bench/autopar/calibrate_gpu.py;
# the H200 has the same GH100 compute, the search warns that the kinds
# differ). With the default h100 profile the 1.3B's 30 GiB choice was 6.9%
# off the best on 2026-12-06 (recompute priced +37 ms, measured +8..+29).
PROFILE=${AUTOPAR_PROFILE:-bench/autopar/calib-h100-cuda.json}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  OUTD=$(mkdir -p "$2" && cd "$2" && pwd)
  cd "$(dirname "$0")/../.."
  BINDIR=${MAPP_BIN:-build/bin}
  OPTS="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
  for entry in $MODELS; do
    model=${entry%%:*}
    cfg=${entry#*:}
    P="$OUTD/plans/autopar/$model"
    mkdir -p "$P"
    "$BINDIR/mapp-translate" --import-gpt-config "$cfg" -o "$P/model.mlir"
    : > "$P/candidates.txt"
    for cap in $CAPS; do
      for card in $CARDS; do
        kind=${card%%:*}
        tag=$cap; [ "$cap" = 0 ] && tag=0-$kind
        # A cap below the card's memory ranks alike on every card: once.
        [ "$cap" != 0 ] && [ "$card" != "${CARDS%% *}" ] && continue
        # The compiling pass: the memory planner checks the ranking's
        # candidates in order and the report names the one chosen.
        "$BINDIR/mapp-opt" "$P/model.mlir" -o /dev/null --mapp-auto-parallel="world=1 global-batch=$BATCH mem-cap-gib=$cap cluster=${AUTOPAR_CLUSTER:-${card#*:}} top=6 report=$P/cap$tag.json pipeline='$OPTS'${PROFILE:+ profile=$PROFILE}" \
          2> "$P/cap$tag.txt"
        /usr/bin/python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["top"]:
    print(r["micro_batch"], r["activation_storage"], r["options"].replace(" ", ","), sep="|")' \
          "$P/cap$tag.json" >> "$P/candidates.txt"
      done
    done
    sort -u "$P/candidates.txt" -o "$P/candidates.txt"
    while IFS='|' read -r mbs storage opts; do
      name="mbs$mbs.$storage.$(echo "$opts" | tr ',=' '._')"
      "$BINDIR/mapp-translate" --import-gpt-config "$cfg" --micro-batch-size "$mbs" -o "$P/m.mlir"
      "$BINDIR/mapp-opt" "$P/m.mlir" "--mapp-train-pipeline=${opts//,/ } $OPTS" \
        "-mapp-plan-memory=activation-storage=$storage" -mlir-print-op-on-diagnostic=false \
        -o "$P/$name.mlir" 2> "$P/$name.remarks.txt"
      "$BINDIR/mapp-translate" --mapp-to-plan "$P/$name.mlir" -o "$P/$name.mplan"
      echo "$name|$mbs|$storage|$opts" >> "$P/plans.txt"
      rm -f "$P/$name.mlir" "$P/m.mlir"
    done < "$P/candidates.txt"
    rm -f "$P/model.mlir"
  done
  cp bench/autopar/gpu.sh "$OUTD/autopar-gpu.sh"
  mkdir -p "$OUTD/bench/autopar/scale"
  for card in $CARDS; do cp "${card#*:}" "$OUTD/bench/autopar/scale/"; done
  cp bench/gpu/runstats.py bench/gpu/common.sh "$OUTD/" 2>/dev/null || true
  echo "prepared: $(cat "$OUTD"/plans/autopar/*/plans.txt | wc -l) plans; on the device run $OUTD/autopar-gpu.sh"
  exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
STEPS=${1:-8}
BACKEND=${BACKEND:-cuda}
LOG=${OUT:-/tmp/mapp-autopar}
mkdir -p "$LOG"
source "$D/common.sh"
if [ -n "${MAPP_RUN:-}" ]; then
  RUN=$MAPP_RUN
else
  unpack mapp-run
  RUN=$BIN/mapp-run
fi

KIND=h200
if [ "$BACKEND" = cuda ]; then
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  [ "${MIB:-0}" -lt 102400 ] && KIND=h100
  echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $MIB MiB: whole-card ranking $KIND"
fi
CARD_GIB=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["memory_gib"])' \
  "$D/bench/autopar/scale/$KIND-single.json")

for entry in $MODELS; do
  model=${entry%%:*}
  P="$D/plans/autopar/$model"
  : > "$LOG/$model.results"
  while IFS='|' read -r name mbs storage opts; do
    echo "== $model $name ($BACKEND)"
    timeout 300 "$RUN" "$P/$name.mplan" --backend=$BACKEND --data "$D/corpus.jsonl" \
      --tokenizer bytes --steps "$STEPS" --seed 11 --quiet --report-memory \
      --metrics "$LOG/$model.$name.jsonl" > "$LOG/$model.$name.log" 2>&1
    rc=$?
    python3 - "$LOG/$model.$name" "$name" "$opts" "$mbs" "$storage" "$rc" >> "$LOG/$model.results" <<'PY'
import json, re, statistics, sys
base, name, opts, mbs, storage, rc = sys.argv[1:7]
try:
    ms = [json.loads(l)["step_ms"] for l in open(base + ".jsonl")][3:]
except OSError:
    ms = []
t = open(base + ".log").read()
peak = re.findall(r"peak device memory ([0-9.]+) GiB", t)
if not peak:  # CPU dry run: the host allocation
    peak = [str(int(b) / 2**30) for b in re.findall(r"memory: allocated (\d+) B", t)]
oom = "out of memory" in t.lower() or "cannot allocate" in t.lower()
print(json.dumps({"name": name, "options": opts, "mbs": int(mbs), "storage": storage,
                  "ok": rc == "0" and bool(ms), "oom": oom,
                  "ms": statistics.median(ms) if ms else None,
                  "peak_gib": float(peak[-1]) if peak else None}))
PY
    tail -1 "$LOG/$model.results"
  done < "$P/plans.txt"
  for cap in $CAPS; do
    tag=$cap; [ "$cap" = 0 ] && tag=0-$KIND
    line=$(python3 - "$LOG/$model.results" "$P/cap$tag.json" "$cap" "$model" "$CARD_GIB" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rep = json.load(open(sys.argv[2]))
cap, model = float(sys.argv[3]), sys.argv[4]
limit = cap if cap > 0 else float(sys.argv[5])
top = rep["top"][rep["chosen"] - 1] if rep.get("chosen") else rep["top"][0]
key = (top["micro_batch"], top["activation_storage"], top["options"].replace(" ", ","))
chosen = next(r for r in rows if (r["mbs"], r["storage"], r["options"]) == key)
fits = [r for r in rows if r["ok"] and r["peak_gib"] is not None and r["peak_gib"] <= limit]
best = min(fits, key=lambda r: r["ms"]) if fits else None
ok = chosen["ok"] and not chosen["oom"] and best is not None and \
    (chosen["peak_gib"] or 0) <= limit and chosen["ms"] <= 1.05 * best["ms"]
cap_s = f"{cap:g} GiB" if cap > 0 else "whole card"
print(f"{model} cap {cap_s}: chose {top['layout']} -> "
      f"{chosen['ms'] or float('nan'):.1f} ms, {chosen['peak_gib'] or float('nan'):.2f} GiB (predicted "
      f"{top['step_ms']:.1f} ms, {top['peak_bytes'] / 2**30:.1f} GiB); best measured "
      f"{best['name'] if best else '-'} {best['ms'] if best else float('nan'):.1f} ms; "
      f"chosen/best {(chosen['ms'] / best['ms'] - 1) * 100 if best and chosen['ms'] else float('nan'):+.1f}%"
      f"{'' if ok else ' FAIL'}")
sys.exit(0 if ok else 1)
PY
)
    record "$line" $?
  done
done
finish "autopar (one $BACKEND device)"

#!/usr/bin/env bash
# The training step as a CUDA graph (MAPP_CUDA_GRAPH=on, docs/cuda-graphs.md)
# against the eager step, on one GPU. Two halves:
#   bench/gpu/graph_check.sh --prepare DIR   (development machine: compiles
#       the plans with mapp-translate/mapp-opt from $MAPP_BIN, default
#       build/bin, and copies the CUDA mapp-run from $MAPP_RUN, default
#       $MAPP_BIN/mapp-run, xz-compressed, into DIR)
#   bench/gpu/graph_check.sh --plans DIR     (device machine, repo root:
#       only DIR's mapp-run and plans)
# (a0), (a), (b) and (d) run with MAPP_CUDA_DETERMINISTIC=1 (no float atomics
# in the step: docs/cuda-backend.md, "Determinism"); (c) on the default,
# (c2) both.
# Checks (each prints PASS or FAIL on its line; the summary ends in PASS):
#  (a) gpt-tiny and 124M, 20 steps, graph off and on: every step's loss and
#      grad_norm bit-identical, and the parameters saved after the last step
#      byte-identical (tensors; the files' metadata names the run).
#  (b) gpt-tiny with an offset perturbation (compiled switched off): steps
#      0-7 with a checkpoint at 8, resumed with the switch turned on by a
#      probe control file and checkpoints every 10 steps, to step 20; off and
#      on give the same losses and byte-identical step-10 and final shards.
#  (c) the 124M step time, graph off vs on, 3 alternated pairs of 20 steps:
#      the median of the per-pair on/off ratios of the median step_ms;
#      (c2) the same for the deterministic eager step against the default.
#  (d) compute-sanitizer memcheck of the captured gpt-tiny run (6 steps).
# GRAPH_CHECK_RUNBIN=PATH: where mapp-run is unpacked (default
# /tmp/mapp-graph-bin/mapp-run, rewritten at every start).
# GRAPH_CHECK_BACKEND=cpu runs (a) and (b) on the CPU backend (no graphs:
# a dry run of the script's flags and comparisons on any machine).
set -uo pipefail

usage() { echo "usage: $0 --prepare DIR | --plans DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
MODE=$1
DIR=$2
PERTURB='{"perturbations": [{"name": "layers.0.mlp.fc1", "kind": "offset", "magnitude": 0.25, "enabled": false, "switch": 0}]}'

if [ "$MODE" = --prepare ]; then
  set -e
  BIN=${MAPP_BIN:-build/bin}
  RUN=${MAPP_RUN:-$BIN/mapp-run}
  OPT="lr=3e-4 beta1=0.9 beta2=0.95 eps=1e-8 weight-decay=0.1"
  BF16=(-mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false)
  mkdir -p "$DIR/plans" "$DIR/bin"
  echo "$PERTURB" > "$DIR/perturb.json"
  plan() { # config out [extra mapp-opt flags]
    local c=$1 out=$2
    shift 2
    "$BIN/mapp-translate" --import-gpt-config "bench/gpu/configs/$c.json" -o "$DIR/plans/$out.mlir"
    "$BIN/mapp-opt" "$DIR/plans/$out.mlir" -mapp-autodiff "-mapp-optimizer=$OPT" \
      "${BF16[@]}" "$@" -o "$DIR/plans/$out.train.mlir"
    "$BIN/mapp-translate" --mapp-to-plan "$DIR/plans/$out.train.mlir" -o "$DIR/plans/$out.mplan"
    rm "$DIR/plans/$out.mlir" "$DIR/plans/$out.train.mlir"
  }
  plan gpt-tiny-e2e tiny
  plan gpt-124m gpt-124m --mapp-recompute=policy=activations
  plan gpt-tiny-e2e tiny-perturb "-mapp-insert-probes=spec=$DIR/perturb.json"
  cp data/gpt/news-1k.jsonl "$DIR/corpus.jsonl"
  xz -T2 -6 -c "$RUN" > "$DIR/bin/mapp-run.xz"
  echo "prepared $DIR: $(ls "$DIR/plans" | tr '\n' ' ')"
  exit 0
fi
[ "$MODE" = --plans ] || usage

export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
LOG=${OUT:-/tmp/mapp-graph-check}
mkdir -p "$LOG"
# Unpacked at every start: a warm device machine keeps /tmp, and an earlier
# call's binary would otherwise run instead of DIR's.
RUNBIN=${GRAPH_CHECK_RUNBIN:-/tmp/mapp-graph-bin/mapp-run}
mkdir -p "$(dirname $RUNBIN)"
xz -dc "$DIR/bin/mapp-run.xz" > $RUNBIN && chmod +x $RUNBIN || { echo "cannot unpack $DIR/bin/mapp-run.xz" >&2; exit 1; }
BACKEND=${GRAPH_CHECK_BACKEND:-cuda}
SUMMARY=()
FAILED=0
say() { echo "$*"; SUMMARY+=("$*"); }
record() { say "$1"; [ "$2" -eq 0 ] || FAILED=1; }

# train NAME GRAPH PLAN STEPS [flags...]: one run, metrics in $LOG/NAME.jsonl;
# deterministic unless DET=0.
DET=1
train() {
  local name=$1 graph=$2 plan=$3 steps=$4
  shift 4
  MAPP_CUDA_DETERMINISTIC=$DET MAPP_CUDA_GRAPH=$graph timeout 300 $RUNBIN "$DIR/plans/$plan.mplan" --backend=$BACKEND \
    --data "$DIR/corpus.jsonl" --tokenizer bytes --steps "$steps" --seed 11 --quiet \
    --metrics "$LOG/$name.jsonl" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { tail -5 "$LOG/$name.log"; }
  return $rc
}

# same A B [FILE...]: losses and grad norms of two metrics files equal bit
# for bit (JSON round-trips doubles), and each pair of FILEs byte-identical.
same() {
  python3 - "$LOG/$1.jsonl" "$LOG/$2.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
keys = ("step", "loss", "grad_norm")
bad = [(x["step"], x["loss"], y["loss"]) for x, y in zip(a, b)
       if any(x[k] != y[k] for k in keys)]
if len(a) != len(b) or not a or bad:
    print(f"{len(a)} vs {len(b)} steps; first differences {bad[:3]}")
    sys.exit(1)
print(f"{len(a)} steps identical (last loss {a[-1]['loss']!r})")
PY
}

# same_tensors A B: two safetensors files hold the same tensors byte for
# byte (their metadata, which names the run, may differ).
same_tensors() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PY
}

# (a) bit-identical losses and parameters
for c in tiny $([ $BACKEND = cuda ] && echo gpt-124m); do
  ok=0
  msg=""
  graphs=""
  train $c.off off $c 20 --save "$LOG/$c.off.safetensors" || ok=1
  train $c.on on $c 20 --save "$LOG/$c.on.safetensors" || ok=1
  if [ $ok -eq 0 ]; then
    msg=$(same $c.off $c.on) || ok=1
    same_tensors "$LOG/$c.off.safetensors" "$LOG/$c.on.safetensors" || { ok=1; msg="$msg; saved parameters differ"; }
  fi
  # The captured run must say it replayed (a refused plan runs eagerly and
  # says why instead).
  graphs=$(grep -h "step graphs:\|MAPP_CUDA_GRAPH" "$LOG/$c.on.log" | head -2)
  if [ $BACKEND = cuda ] && ! echo "$graphs" | grep -q "1 captured, 18 replayed"; then
    ok=1
    msg="${msg:-}; graphs: ${graphs:-no step-graph line}"
  fi
  record "(a) $c graph off vs on, 20 steps: $([ $ok -eq 0 ] && echo PASS || echo FAIL) ${msg:-run failed} [${graphs:-}]" $ok
  # The eager run against itself: where it differs, the backend's kernels
  # are not run-to-run deterministic, and no graph can be bit-identical to
  # an eager run; (a0) fails apart from (a).
  if [ $BACKEND = cuda ]; then
    ok=0
    floor=""
    train $c.off2 off $c 20 || ok=1
    [ $ok -eq 0 ] && { floor=$(same $c.off $c.off2) || ok=1; }
    record "(a0) $c eager vs eager: $([ $ok -eq 0 ] && echo PASS || echo FAIL) ${floor:-run failed}" $ok
  fi
done

# (b) a perturbation switched on at step 8 and a checkpoint at step 10
echo '{"switches": [{"id": 0, "enabled": true, "magnitude": 0.25}]}' > "$LOG/switch-on.json"
chmod 600 "$LOG/switch-on.json"
ok=0
for g in off on; do
  rm -rf "$LOG/ck1.$g" "$LOG/ck2.$g"
  train pert1.$g $g tiny-perturb 8 --save-dir "$LOG/ck1.$g" || ok=1
  train pert2.$g $g tiny-perturb 20 --resume "$LOG/ck1.$g" --save-dir "$LOG/ck2.$g" \
    --save-every 10 --save-keep 0 --probe-control "$LOG/switch-on.json" || ok=1
done
msg=""
if [ $ok -eq 0 ]; then
  m1=$(same pert1.off pert1.on) || ok=1
  m2=$(same pert2.off pert2.on) || ok=1
  msg="steps 0-7: $m1; steps 8-19: $m2"
  for s in 00000010 00000020; do
    for f in "$LOG/ck2.off/step-$s"/*.safetensors; do
      same_tensors "$f" "$LOG/ck2.on/step-$s/$(basename "$f")" || { ok=1; msg="$msg; step-$s $(basename "$f") differs"; }
    done
  done
  # Steps 0-7: warm-up 0, capture 1, replays 2-7; 8-19 (the new key):
  # warm-up 8, capture 9, replays 10-19.
  if [ $BACKEND = cuda ]; then
    grep -q "1 eager, 1 captured, 6 replayed" "$LOG/pert1.on.log" || { ok=1; msg="$msg; steps 0-7 not replayed"; }
    grep -q "1 eager, 1 captured, 10 replayed" "$LOG/pert2.on.log" || { ok=1; msg="$msg; steps 8-19 not replayed"; }
  fi
  # The switch must have changed the run: perturbed losses differ from (a)'s.
  python3 - "$LOG/tiny.off.jsonl" "$LOG/pert2.off.jsonl" <<'PY' || { ok=1; msg="$msg; the switch changed nothing"; }
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
la = {x["step"]: x["loss"] for x in a}
sys.exit(0 if any(la.get(x["step"]) != x["loss"] for x in b) else 1)
PY
fi
record "(b) tiny, switch on at step 8, checkpoint at 10, off vs on: $([ $ok -eq 0 ] && echo PASS || echo FAIL) $msg" $ok

[ $BACKEND = cuda ] || { printf '%s\n' "${SUMMARY[@]}"; exit $FAILED; }

# (c) step time, alternated pairs, on the default (atomic, tuned) kernels;
# (c2) the deterministic eager step against the default eager step, run in
# the same alternation (what MAPP_CUDA_DETERMINISTIC=1 costs).
ok=0
for i in 1 2 3; do
  DET=0 train time$i.off off gpt-124m 20 || ok=1
  DET=0 train time$i.on on gpt-124m 20 || ok=1
  DET=1 train time$i.det off gpt-124m 20 || ok=1
done
lines=$(python3 - "$LOG" <<'PY'
import json, statistics, sys
log = sys.argv[1]
def med(name):
    r = [json.loads(l) for l in open(f"{log}/{name}.jsonl") if l.strip()]
    return statistics.median(x["step_ms"] for x in r[3:])
for other, label in (("on", "off, on"), ("det", "default, deterministic")):
    pairs = [(med(f"time{i}.off"), med(f"time{i}.{other}")) for i in (1, 2, 3)]
    ratio = statistics.median(b / a for a, b in pairs)
    print(f"pairs ({label} ms): " + ", ".join(f"({a:.2f}, {b:.2f})" for a, b in pairs)
          + f"; median {other}/off {ratio:.3f}")
PY
) || ok=1
record "(c) 124M step time graph off vs on: $(echo "$lines" | sed -n 1p)" $ok
record "(c2) 124M eager step time default vs MAPP_CUDA_DETERMINISTIC=1: $(echo "$lines" | sed -n 2p)" $ok

# (d) memcheck of the captured tiny run
if command -v compute-sanitizer > /dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  MAPP_CUDA_DETERMINISTIC=1 MAPP_CUDA_GRAPH=on timeout 500 $CS --tool memcheck $RUNBIN "$DIR/plans/tiny.mplan" \
    --backend=cuda --data "$DIR/corpus.jsonl" --tokenizer bytes --steps 6 --seed 11 \
    --quiet > "$LOG/memcheck.log" 2>&1
  rc=$?
  es=$(grep -h "ERROR SUMMARY" "$LOG/memcheck.log" | tail -1)
  [ $rc -eq 0 ] && echo "$es" | grep -q " 0 errors" && ok=0 || ok=1
  record "(d) compute-sanitizer memcheck, tiny, graph on: $([ $ok -eq 0 ] && echo PASS || echo FAIL) ${es:-no summary (rc $rc)}" $ok
else
  record "(d) compute-sanitizer not found: FAIL" 1
fi

echo
echo "================ graph check summary ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null))"
printf '%s\n' "${SUMMARY[@]}"
[ $FAILED -eq 0 ] && echo "PASS" || echo "FAIL"
exit $FAILED

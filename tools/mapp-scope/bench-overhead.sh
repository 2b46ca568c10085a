#!/usr/bin/env bash
# Probe overhead on a CPU training run: steps/s of examples/gpt-tiny.json
# without probes, with probes compiled in but no store (kernels return at
# once), and with a store recording every probe every step.
# Usage: tools/mapp-scope/bench-overhead.sh [STEPS]   (from the repo root, after scripts/build.sh)
set -euo pipefail
STEPS=${1:-200}
B=build/bin
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cat > "$T/spec.json" <<'JSON'
{"probes": [
  {"name": "layers.*.mlp.fc1", "reduce": ["max", "mean", "std", "absmax", "sparsity", "hist"]},
  {"name": "layers.*.attn.probs", "reduce": ["attn"]},
  {"name": "layers.*", "reduce": ["sketch"], "dim": 16},
  {"name": "logits", "reduce": ["topk"], "k": 20, "tokens": "last"},
  {"name": "grad:layers.*.mlp.fc1", "reduce": ["std", "absmax"]}
]}
JSON
$B/mapp-translate --import-gpt-config examples/gpt-tiny.json -o "$T/model.mlir"
$B/mapp-opt "$T/model.mlir" -mapp-autodiff -mapp-optimizer -o "$T/plain.mlir"
$B/mapp-opt "$T/plain.mlir" -mapp-insert-probes="spec=$T/spec.json" -o "$T/probed.mlir"
$B/mapp-translate --mapp-to-plan "$T/plain.mlir" -o "$T/plain.mplan"
$B/mapp-translate --mapp-to-plan "$T/probed.mlir" -o "$T/probed.mplan"
run() { # plan tag extra...
  local plan=$1 tag=$2; shift 2
  $B/mapp-run "$T/$plan.mplan" --data data/gpt/news-1k.jsonl --tokenizer bytes \
    --steps "$STEPS" --threads 1 --metrics "$T/$tag.jsonl" --quiet "$@"
  /usr/bin/python3 - "$T/$tag.jsonl" "$tag" <<'PY'
import json, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])][10:]  # skip warm-up
ms.sort()
med = ms[len(ms) // 2]
print(f"{sys.argv[2]:<28} {1000 / med:8.1f} steps/s  (median step {med:.2f} ms)")
PY
}
echo "gpt-tiny (L=2, H=64, T=32, B=4), $STEPS steps, 1 thread"
run plain "no probes"
run probed "probes, no store"
run probed "probes + SQLite store" --probe-db "$T/p.sqlite"
echo "store: $(du -h "$T/p.sqlite" | cut -f1), $(sqlite3 "$T/p.sqlite" 'select count(*) from samples' 2>/dev/null || echo '?') samples"

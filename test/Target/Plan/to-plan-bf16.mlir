// bf16 activation storage end to end, on the tiny GPT (a real backward:
// the fused qkv concat, wgrad contributions, views).
// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-translate --import-gpt-config %mapp_src/examples/gpt-tiny.json -o %t/model.mlir
// RUN: mapp-opt %t/model.mlir -mapp-autodiff -mapp-optimizer="lr=1e-3" -o %t/f32.mlir
// RUN: mapp-opt %t/f32.mlir -mapp-plan-memory=activation-storage=bf16 -o %t/bf16.mlir 2>&1 | FileCheck %s
// RUN: mapp-translate --mapp-to-plan %t/f32.mlir -o %t/f32.mplan
// RUN: mapp-translate --mapp-to-plan %t/bf16.mlir -o %t/bf16.mplan
// RUN: flatc --json --raw-binary --strict-json --defaults-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/f32.mplan %t/bf16.mplan
// RUN: python3 %S/Inputs/check_bf16_storage.py %t/f32.json %t/bf16.json | FileCheck %s --check-prefix=PLAN
// The CPU backend stores fp32: it runs the bf16 plan with the arena doubled
// and trains to bit-identical losses.
// RUN: mapp-run %t/f32.mplan --data %data/gpt/news-1k.jsonl --tokenizer bytes --steps 3 --metrics %t/f32.jsonl --quiet
// RUN: mapp-run %t/bf16.mplan --data %data/gpt/news-1k.jsonl --tokenizer bytes --steps 3 --metrics %t/bf16.jsonl --quiet
// RUN: python3 -c "import json,sys; l=[[json.loads(x)['loss'] for x in open(f)] for f in sys.argv[1:]]; assert len(l[0]) == 3 and l[0] == l[1], l" %t/f32.jsonl %t/bf16.jsonl

// CHECK: remark: memory plan, stage 0: {{.*}}; {{[1-9][0-9]*}} values stored bf16
// PLAN: values stored bf16: {{[1-9][0-9]*}}; arena {{[0-9]+}} -> {{[0-9]+}} B

// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="lr=1e-3" -o %t/train.mlir
// RUN: mapp-translate --mapp-to-plan %t/train.mlir -o %t/alias.mplan
// RUN: mapp-translate --mapp-to-plan --mapp-plan-copy-reshapes %t/train.mlir -o %t/copy.mplan
// RUN: flatc --json --raw-binary --strict-json --defaults-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/alias.mplan %t/copy.mplan
// RUN: FileCheck %s < %t/alias.json
// RUN: FileCheck %s --check-prefix=COPY < %t/copy.json
// Both plans train to the same losses on the CPU backend.
// RUN: mapp-run %t/alias.mplan --data %data/gpt/news-1k.jsonl --tokenizer bytes --steps 3 --metrics %t/alias.jsonl --quiet
// RUN: mapp-run %t/copy.mplan --data %data/gpt/news-1k.jsonl --tokenizer bytes --steps 3 --metrics %t/copy.jsonl --quiet
// RUN: python3 -c "import json,sys; l=[[json.loads(x)['loss'] for x in open(f)] for f in sys.argv[1:]]; assert len(l[0]) == 3 and l[0] == l[1], l" %t/alias.jsonl %t/copy.jsonl

// The reshape results are views: the same offset as their operand, and the
// instruction carries `alias` (the runtime copies nothing).
// CHECK: "name": "embedding",
// CHECK: "offset": [[X:[0-9]+]],
// CHECK: "name": "x2d",
// CHECK: "offset": [[X]],
// CHECK: "name": "linear",
// CHECK: "offset": [[H:[0-9]+]],
// CHECK: "name": "h3d",
// CHECK: "offset": [[H]],
// CHECK: "kernel": "reshape",
// CHECK: "key": "alias",
// CHECK-NEXT: "kind": "Int",
// CHECK-NEXT: "i": 1,
// CHECK: "name": "x2d",

// --mapp-plan-copy-reshapes: own storage, no alias attribute.
// COPY: "name": "embedding",
// COPY: "offset": [[X:[0-9]+]],
// COPY: "name": "x2d",
// COPY-NOT: "offset": [[X]],
// COPY: "bytes"
// COPY-NOT: "alias"

mapp.param @wte : tensor<256x8xf32>
mapp.param @fc.weight : tensor<8x8xf32>
func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %wte = mapp.param_ref @wte : tensor<256x8xf32>
  %x = mapp.embedding %wte, %tokens : (tensor<256x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %x2 = mapp.reshape %x {mapp.name = "x2d"} : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
  %w = mapp.param_ref @fc.weight : tensor<8x8xf32>
  %h = mapp.linear %x2, %w : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<8x8xf32>
  %h3 = mapp.reshape %h {mapp.name = "h3d"} : (tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %logits = mapp.linear %h3, %wte : (tensor<2x4x8xf32>, tensor<256x8xf32>) -> tensor<2x4x256xf32>
  %loss = mapp.cross_entropy %logits, %targets : (tensor<2x4x256xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

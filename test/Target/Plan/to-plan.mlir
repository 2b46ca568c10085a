// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-opt %s -mapp-autodiff="loss-scale=0.5" -mapp-optimizer="lr=1e-3 max-grad-norm=1.0" | mapp-translate --mapp-to-plan -o %t/p.mplan
// RUN: flatc --json --raw-binary --strict-json --defaults-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/p.mplan
// RUN: FileCheck %s < %t/p.json
// The seal after the body (plan.fbs PlanSeal), checked with Python's zlib.
// RUN: python3 -c "import struct, sys, zlib; b = open(sys.argv[1], 'rb').read(); m, v, n, c, r = struct.unpack('<IIQII', b[-24:]); print('seal', hex(m), v, n == len(b) - 24, c == zlib.crc32(b[:-8]), r)" %t/p.mplan | FileCheck %s --check-prefix=SEAL
// SEAL: seal 0x4c53504d 2 True True 0

// The serialized plan, read back by flatc (independent of our writer).
// CHECK: "version": 2,
// CHECK: "world_size": 1,
// CHECK: "micro_batch_size": 2,
// CHECK: "num_microbatches": 1,
// CHECK: "seq_length": 4,
// CHECK: "vocab_size": 16,
// CHECK: "optimizer": "adamw",
// CHECK: "max_grad_norm": 1.0,
// Parameter, gradient and two AdamW moments, back to back in the pool.
// CHECK: "name": "wte",
// CHECK-NEXT: "kind": "Param",
// CHECK: "name": "wte.grad",
// CHECK-NEXT: "kind": "Grad",
// CHECK: "offset": 512,
// CHECK: "param": 0
// CHECK: "name": "wte.state0",
// CHECK-NEXT: "kind": "OptState",
// CHECK: "name": "tokens",
// CHECK-NEXT: "kind": "Input",
// CHECK: "name": "cross_entropy",
// CHECK-NEXT: "kind": "Loss",
// Blocks: forward, backward, optimizer.
// CHECK: "blocks": [
// CHECK: "kind": "Forward",
// CHECK: "kernel": "embedding",
// CHECK-NEXT: "inputs": [
// CHECK-NEXT: 0,
// CHECK: "kernel": "cross_entropy",
// CHECK: "kind": "Backward",
// CHECK: "kernel": "fill",
// CHECK: "key": "value",
// CHECK: "f": 0.5
// CHECK: "kernel": "grad_accumulate",
// CHECK-NEXT: "inputs": [
// CHECK: "outputs": [
// CHECK-NEXT: 1
// CHECK: "kind": "Optimizer",
// CHECK: "kernel": "global_norm",
// AdamW reads (param, grad, m, v, norm) and updates in place.
// CHECK: "kernel": "adamw",
// CHECK-NEXT: "inputs": [
// CHECK-NEXT: 0,
// CHECK-NEXT: 1,
// CHECK-NEXT: 2,
// CHECK-NEXT: 3,
// CHECK: "tasks": [
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 0
// CHECK: "block": 1,
// CHECK: "block": 2,
// CHECK: "tokens": {{[0-9]+}},
// CHECK-NEXT: "targets": {{[0-9]+}},
// CHECK-NEXT: "loss": {{[0-9]+}},

mapp.param @wte : tensor<16x8xf32>
mapp.param @fc.weight : tensor<8x8xf32>
func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %wte = mapp.param_ref @wte : tensor<16x8xf32>
  %x = mapp.embedding %wte, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %w = mapp.param_ref @fc.weight : tensor<8x8xf32>
  %h = mapp.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %logits = mapp.linear %h, %wte : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %loss = mapp.cross_entropy %logits, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// RUN: mapp-opt %s -mapp-plan-memory -mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s

// Four 64 KiB activations in a chain need only two buffers; tokens (1 KiB)
// die after the lookup and reuse a freed range; targets (1 KiB) live to the
// loss. Arena = 2 x 64 KiB + 1 KiB; without reuse 4 x 64 KiB + 2 KiB + 256.
// Persistent: the parameter and its gradient (no optimizer): 2 x 16 KiB.

// CHECK: remark: memory plan, stage 0: peak 164864 B (0.16 MiB) = persistent 32768 B + 1 slot(s) x arena 132096 B (264448 B without reuse)
// CHECK: mapp.memory = [{arena_bytes = 132096 : i64, peak_bytes = 164864 : i64, persistent_bytes = 32768 : i64, slots = 1 : i64, stage = 0 : i64, stash_bytes = 0 : i64}]

mapp.param @w : tensor<64x64xf32>
func.func @f(%t: tensor<4x64xi32> {mapp.input = "tokens"}, %g: tensor<4x64xi32> {mapp.input = "targets"}) -> tensor<f32> attributes {mapp.phase = "forward"} {
  %w = mapp.param_ref @w : tensor<64x64xf32>
  %x = mapp.embedding %w, %t : (tensor<64x64xf32>, tensor<4x64xi32>) -> tensor<4x64x64xf32>
  %a = mapp.gelu %x : tensor<4x64x64xf32>
  %b = mapp.gelu %a : tensor<4x64x64xf32>
  %c = mapp.gelu %b : tensor<4x64x64xf32>
  %l = mapp.cross_entropy %c, %g : (tensor<4x64x64xf32>, tensor<4x64xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

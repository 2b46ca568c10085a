// RUN: mapp-opt %s -split-input-file -mapp-plan-memory=activation-storage=bf16 -mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s
// RUN: not mapp-opt %s -split-input-file -mapp-plan-memory=activation-storage=fp8 2>&1 | FileCheck %s --check-prefix=BADOPT
// RUN: not mapp-opt %s -split-input-file -mapp-plan-memory 2>&1 | FileCheck %s --check-prefix=BADATTR

// bf16 activations: the plan-memory-alias.mlir module, every f32 value of
// rank >= 2 at 2 bytes an element. %x (with its views %r and %r2) and %a take
// 2 KiB each instead of 4; tokens, targets and the loss keep 256 B. Same
// placement: arena = 2 x 2048 + 256 = 4352 B, 2 x 2048 + 3 x 256 = 4864 B
// without reuse; 4 values (%x, %r, %r2, %a) stored bf16.
// CHECK: remark: memory plan, stage 0: peak 6400 B (0.01 MiB) = persistent 2048 B + 1 slot(s) x arena 4352 B (4864 B without reuse); reshapes: 2 aliased, 0 copied; 4 values stored bf16
// BADOPT: error: mapp-plan-memory: activation-storage must be f32 or bf16, got 'fp8'

mapp.param @w : tensor<16x16xf32>
func.func @f(%t: tensor<4x16xi32> {mapp.input = "tokens"}, %g: tensor<4x16xi32> {mapp.input = "targets"}) -> tensor<f32> attributes {mapp.phase = "forward", mapp.loss} {
  %w = mapp.param_ref @w : tensor<16x16xf32>
  %x = mapp.embedding %w, %t : (tensor<16x16xf32>, tensor<4x16xi32>) -> tensor<4x16x16xf32>
  %r = mapp.reshape %x : (tensor<4x16x16xf32>) -> tensor<64x16xf32>
  %r2 = mapp.reshape %r : (tensor<64x16xf32>) -> tensor<4x16x16xf32>
  %a = mapp.add %x, %r2 : (tensor<4x16x16xf32>, tensor<4x16x16xf32>) -> tensor<4x16x16xf32>
  %l = mapp.cross_entropy %a, %g : (tensor<4x16x16xf32>, tensor<4x16xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// An alias chain is one buffer with one storage type: %x's view %flat has
// rank 1, so %x and %flat stay fp32 (4 KiB), and so do %s (rank 1) and its
// view %y. Nothing is stored bf16 and the arena is the fp32 plan's: %x/%flat
// and %s/%y, 4 KiB each, are both live at the scale, targets sits above
// them, tokens and the loss reuse freed bytes: 2 x 4096 + 256 = 8448 B.
// CHECK: remark: memory plan, stage 0: peak 10496 B (0.01 MiB) = persistent 2048 B + 1 slot(s) x arena 8448 B (8960 B without reuse); reshapes: 2 aliased, 0 copied; 0 values stored bf16
// The option overrides the module attribute; without it the attribute
// selects the storage, and a value it does not know is an error.
// BADATTR: error: mapp.activation_storage must be "f32" or "bf16", got "half"

module attributes {mapp.activation_storage = "half"} {
mapp.param @w : tensor<16x16xf32>
func.func @f(%t: tensor<4x16xi32> {mapp.input = "tokens"}, %g: tensor<4x16xi32> {mapp.input = "targets"}) -> tensor<f32> attributes {mapp.phase = "forward", mapp.loss} {
  %w = mapp.param_ref @w : tensor<16x16xf32>
  %x = mapp.embedding %w, %t : (tensor<16x16xf32>, tensor<4x16xi32>) -> tensor<4x16x16xf32>
  %flat = mapp.reshape %x : (tensor<4x16x16xf32>) -> tensor<1024xf32>
  %s = mapp.scale %flat {factor = 2.0 : f64} : tensor<1024xf32>
  %y = mapp.reshape %s : (tensor<1024xf32>) -> tensor<4x16x16xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<4x16x16xf32>, tensor<4x16xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
}

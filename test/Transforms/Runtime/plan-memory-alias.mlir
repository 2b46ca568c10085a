// RUN: mapp-opt %s -split-input-file -mapp-plan-memory -mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s

// A reshape is a row-major copy with the same dtype and element count, so
// the memory plan makes it a view: its result takes its operand's offset
// and the operand lives until the view's last use. Here %r and %r2 (a
// chain) share %x's 4 KiB, which lives over ops 1..4; %a (4 KiB) overlaps
// it at op 4; tokens (op 0..1) reuse %a's range; targets (0..5) sit above
// both; the loss (5..6) reuses %x's range. Arena = 2 x 4096 + 256 = 8448 B;
// without reuse 2 x 4096 + 3 x 256 = 8960 B. With copies %r and %r2 would
// each need 4 KiB live next to %x (arena 12544 B).
// Persistent: the parameter and its gradient, 2 x 1 KiB.

// CHECK: remark: memory plan, stage 0: peak 10496 B (0.01 MiB) = persistent 2048 B + 1 slot(s) x arena 8448 B (8960 B without reuse); reshapes: 2 aliased, 0 copied

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

// Reshapes that must copy: %br reads a parameter and %gf the gradient
// (pool buffers that updates and grad_accumulate write), and %d feeds
// adamw, which may write its operands in place. Live ranges (op index):
// tokens 0..3, targets 0..6, %x 3..5, %br 4..5, %a 5..6, loss 6..7, then the
// optimizer's %gf 9..11, %d 10..12, norm 11..12. Placed biggest first:
// %x 0, %a 4096, %br 8192, %gf 0, %d 1024, tokens 4096, targets 9216,
// loss 0, norm 2048: arena 9472 B (2 x 4096 + 3 x 1024 + 4 x 256 = 12288 B
// without reuse). Persistent: @w with grad and two AdamW moments (4 KiB)
// and @b with its grad (2 KiB).
// CHECK: remark: memory plan, stage 0: peak 15616 B (0.01 MiB) = persistent 6144 B + 1 slot(s) x arena 9472 B (12288 B without reuse); reshapes: 0 aliased, 3 copied

mapp.param @w : tensor<16x16xf32>
mapp.param @b : tensor<256xf32>
func.func @f(%t: tensor<4x16xi32> {mapp.input = "tokens"}, %g: tensor<4x16xi32> {mapp.input = "targets"}) -> tensor<f32> attributes {mapp.phase = "forward", mapp.loss} {
  %w = mapp.param_ref @w : tensor<16x16xf32>
  %b = mapp.param_ref @b : tensor<256xf32>
  %x = mapp.embedding %w, %t : (tensor<16x16xf32>, tensor<4x16xi32>) -> tensor<4x16x16xf32>
  %br = mapp.reshape %b : (tensor<256xf32>) -> tensor<16x16xf32>
  %a = mapp.add %x, %br : (tensor<4x16x16xf32>, tensor<16x16xf32>) -> tensor<4x16x16xf32>
  %l = mapp.cross_entropy %a, %g : (tensor<4x16x16xf32>, tensor<4x16xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
func.func @optimizer_step() attributes {mapp.phase = "optimizer"} {
  %gr = mapp.grad_ref @w : tensor<16x16xf32>
  %gf = mapp.reshape %gr : (tensor<16x16xf32>) -> tensor<256xf32>
  %d = mapp.reshape %gf : (tensor<256xf32>) -> tensor<16x16xf32>
  %n = mapp.global_norm %gf : tensor<256xf32> -> tensor<f32>
  mapp.adamw @w, %d clip(%n : tensor<f32>) {lr = 1.0e-3 : f64, max_norm = 1.0 : f64} : tensor<16x16xf32>
  return
}

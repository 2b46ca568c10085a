// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s

// Beyond chains (docs/fusion.md, "Grouping"): open sibling regions that
// load the same value merge, and an elementwise op after the GEMM that
// closed a region joins it when everything it loads is defined before that
// GEMM (the fused op is placed there). Together they make a SwiGLU's
// backward one kernel, as autodiff and --mapp-recompute write it: the
// product's two gradients read dh once, the recomputed silu runs inside,
// and silu_grad (after the up-projection's GEMM read du) joins. (In a
// backward function every op may share a region with the recomputed ones:
// no forward op is there.)

// CHECK-LABEL: func.func @swiglu_backward
func.func @swiglu_backward(%dh: tensor<2x8xf32>, %u: tensor<2x8xf32>, %g: tensor<2x8xf32>,
                           %w: tensor<8x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>)
    attributes {mapp.phase = "backward"} {
  // CHECK: %[[R:.*]]:2 = mapp.fused %arg0, %arg1, %arg2 {domain = array<i64: 2, 8>, mapp.name = "layers.0.mlp.silu.grad", outputs = array<i64: 2, 3>, program = "mul(%i0, %i1); silu(%i2); mul(%i0, %1); silu_grad(%0, %i2)"}
  // CHECK-NEXT: %[[DXU:.*]] = mapp.matmul %[[R]]#0, %arg3
  // CHECK-NEXT: %[[DXG:.*]] = mapp.matmul %[[R]]#1, %arg3
  // CHECK-NEXT: return %[[DXU]], %[[DXG]]
  %ds = mapp.mul %dh, %u {mapp.name = "layers.0.mlp.mul.grad"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %s = mapp.silu %g {mapp.name = "layers.0.mlp.silu.recompute"} : tensor<2x8xf32>
  %du = mapp.mul %dh, %s {mapp.name = "layers.0.mlp.mul.grad"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %dxu = mapp.matmul %du, %w {mapp.name = "layers.0.mlp.up.grad"} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  %dg = mapp.silu_grad %ds, %g {mapp.name = "layers.0.mlp.silu.grad"} : tensor<2x8xf32>
  %dxg = mapp.matmul %dg, %w {mapp.name = "layers.0.mlp.gate.grad"} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  return %dxu, %dxg : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// Siblings that share no load stay apart (merging would save no bytes).
// CHECK-LABEL: func.func @siblings_apart
func.func @siblings_apart(%a: tensor<2x8xf32>, %b: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  // CHECK: mapp.fused %arg0 {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "exp(%i0); neg(%0)"}
  // CHECK-NEXT: mapp.fused %arg1 {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "tanh(%i0); abs(%0)"}
  %x = mapp.exp %a : tensor<2x8xf32>
  %y = mapp.tanh %b : tensor<2x8xf32>
  %x2 = mapp.neg %x : tensor<2x8xf32>
  %y2 = mapp.abs %y : tensor<2x8xf32>
  return %x2, %y2 : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// No hoisting past an op with memory effects (a probe, a collective) met
// after the closing GEMM, nor of an op loading a value defined after it.
// CHECK-LABEL: func.func @no_hoist
func.func @no_hoist(%x: tensor<2x8xf32>, %w: tensor<8x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>) {
  // CHECK: %[[A:.*]]:2 = mapp.fused %arg0 {domain = array<i64: 2, 8>, outputs = array<i64: 0, 1>, program = "exp(%i0); neg(%0)"}
  // CHECK-NEXT: %[[M:.*]] = mapp.matmul %[[A]]#1, %arg1
  // CHECK-NEXT: mapp.probe %[[M]]
  // CHECK-NEXT: %[[T:.*]] = mapp.tanh %[[A]]#0
  // CHECK-NEXT: %[[U:.*]] = mapp.fused %[[A]]#0, %[[M]] {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "sigmoid(%i0); mul(%0, %i1)"}
  %e = mapp.exp %x : tensor<2x8xf32>
  %n = mapp.neg %e : tensor<2x8xf32>
  %m = mapp.matmul %n, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  mapp.probe %m {probe_id = 0 : i64, point = "layers.0.out", reduce = "max"} : tensor<2x8xf32>
  %t = mapp.tanh %e : tensor<2x8xf32>
  %s = mapp.sigmoid %e : tensor<2x8xf32>
  %u = mapp.mul %s, %m : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %t, %u, %m : tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>
}

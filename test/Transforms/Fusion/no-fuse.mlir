// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s

// What --mapp-fuse must not fuse (docs/fusion.md): every value read by an
// op outside a region is materialized at the point the unfused graph had
// it, and nothing is computed twice.

// A value needed by a collective: the region ends at the value the
// all_reduce reads; what follows the collective is a new region.
// CHECK-LABEL: func.func @collective
func.func @collective(%x: tensor<2x8xf32>, %b: tensor<8xf32>) -> tensor<2x8xf32> {
  // CHECK: %[[A:.*]] = mapp.fused %arg0, %arg1 {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "add(%i0, %i1); gelu(%0)"}
  %a = mapp.add %x, %b : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  %g = mapp.gelu %a : tensor<2x8xf32>
  // CHECK-NEXT: %[[R:.*]] = mapp.all_reduce %[[A]]
  %r = mapp.all_reduce %g {group = "tp"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  // gelu's value is read after the collective too: still the same output,
  // not recomputed after it.
  // CHECK-NEXT: mapp.fused %[[R]], %[[A]] {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "mul(%i0, %i1); tanh(%0)"}
  %m = mapp.mul %r, %g : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %t = mapp.tanh %m : tensor<2x8xf32>
  return %t : tensor<2x8xf32>
}

// -----

// A probe point (MegaScope): the probed value is materialized; the chain
// after it is a separate region, so the probe sees the unfused value.
// CHECK-LABEL: func.func @probe
func.func @probe(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  // CHECK: %[[S:.*]] = mapp.fused %arg0 {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "exp(%i0); sigmoid(%0)"}
  %e = mapp.exp %x : tensor<2x8xf32>
  %s = mapp.sigmoid %e : tensor<2x8xf32>
  // CHECK-NEXT: mapp.probe %[[S]]
  mapp.probe %s {probe_id = 0 : i64, point = "layers.0.mlp.act", reduce = "max"} : tensor<2x8xf32>
  // CHECK-NEXT: mapp.fused %[[S]] {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "neg(%i0); abs(%0)"}
  %n = mapp.neg %s : tensor<2x8xf32>
  %a = mapp.abs %n : tensor<2x8xf32>
  return %a : tensor<2x8xf32>
}

// -----

// A recomputation boundary: ops that --mapp-recompute cloned into the
// backward (".recompute" names) never share a region with the forward's
// ops: the forward region ending in the saved value stays apart from the
// clones that recompute from it, even while it is open. The backward's own
// ops may join the clones (the recomputed silu runs inside the kernel of
// its gradient).
// CHECK-LABEL: func.func @recompute_boundary
func.func @recompute_boundary(%x: tensor<2x8xf32>, %dy: tensor<2x8xf32>)
    -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  // CHECK: %[[H:.*]] = mapp.fused %arg0 {domain = array<i64: 2, 8>, mapp.name = "layers.0.mlp.pre", outputs = array<i64: 1>, program = "exp(%i0); tanh(%0)"}
  %e = mapp.exp %x {mapp.name = "layers.0.mlp.exp"} : tensor<2x8xf32>
  %h = mapp.tanh %e {mapp.name = "layers.0.mlp.pre"} : tensor<2x8xf32>
  // CHECK-NEXT: %[[N:.*]] = mapp.fused %[[H]], %arg1 {domain = array<i64: 2, 8>, mapp.name = "layers.0.mlp.act.grad", outputs = array<i64: 3>, program = "scale[2](%i0); silu(%0); mul(%i1, %1); neg(%2)"}
  %h2 = mapp.scale %h {factor = 2.0, mapp.name = "layers.0.mlp.scale.recompute"} : tensor<2x8xf32>
  %g = mapp.silu %h2 {mapp.name = "layers.0.mlp.act.recompute"} : tensor<2x8xf32>
  %d = mapp.mul %dy, %g {mapp.name = "layers.0.mlp.mul.grad"} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %n = mapp.neg %d {mapp.name = "layers.0.mlp.act.grad"} : tensor<2x8xf32>
  // CHECK-NEXT: return %[[N]], %[[H]]
  return %n, %h : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// A GEMM result with two consumers: each chain reads it from memory; the
// GEMM is never duplicated into a region. A value read by an op between
// two chain links (the second GEMM) splits the chain there.
// CHECK-LABEL: func.func @gemm_two_consumers
func.func @gemm_two_consumers(%x: tensor<2x8xf32>, %w: tensor<8x8xf32>)
    -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  // CHECK: %[[H:.*]] = mapp.linear
  // CHECK-NOT: mapp.linear
  %h = mapp.linear %x, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  // CHECK: %[[A:.*]] = mapp.fused %[[H]] {domain = array<i64: 2, 8>, outputs = array<i64: 1>, program = "sigmoid(%i0); exp(%0)"}
  %a1 = mapp.sigmoid %h : tensor<2x8xf32>
  %a2 = mapp.exp %a1 : tensor<2x8xf32>
  // CHECK-NEXT: %[[H2:.*]] = mapp.linear %[[A]]
  %h2 = mapp.linear %a2, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
  // CHECK-NEXT: mapp.fused %[[H]], %[[A]], %[[H2]] {domain = array<i64: 2, 8>, outputs = array<i64: 2>, program = "tanh(%i0); add(%0, %i1); mul(%1, %i2)"}
  %b1 = mapp.tanh %h : tensor<2x8xf32>
  %b2 = mapp.add %b1, %a2 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  %b3 = mapp.mul %b2, %h2 : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %b3, %h : tensor<2x8xf32>, tensor<2x8xf32>
}

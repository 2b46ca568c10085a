// RUN: mapp-opt %s -canonicalize -split-input-file | FileCheck %s

// CHECK-LABEL: func.func @identities
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32>)
func.func @identities(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %0 = mapp.scale %x {factor = 1.0 : f64} : tensor<2x8xf32>
  %1 = mapp.dropout %0 {p = 0.0 : f64, seed = 3 : i64} : tensor<2x8xf32>
  %2 = mapp.transpose %1 {perm = array<i64: 0, 1>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %3 = mapp.reshape %2 : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %4 = mapp.slice %3 {dim = 1 : i64, start = 0 : i64, end = 8 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %5 = mapp.reduce_sum %4 {dims = array<i64>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  // CHECK-NEXT: return %[[X]]
  return %5 : tensor<2x8xf32>
}

// -----

// CHECK-LABEL: func.func @chains
func.func @chains(%x: tensor<2x3x4xf32>) -> (tensor<24xf32>, tensor<4x2x3xf32>, tensor<2x3x4xf32>) {
  // CHECK: %[[R:.*]] = mapp.reshape %arg0 : (tensor<2x3x4xf32>) -> tensor<24xf32>
  %0 = mapp.reshape %x : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %1 = mapp.reshape %0 : (tensor<6x4xf32>) -> tensor<24xf32>
  // CHECK: %[[T:.*]] = mapp.transpose %arg0 {perm = array<i64: 2, 0, 1>}
  %2 = mapp.transpose %x {perm = array<i64: 1, 2, 0>} : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
  %3 = mapp.transpose %2 {perm = array<i64: 1, 2, 0>} : (tensor<3x4x2xf32>) -> tensor<4x2x3xf32>
  // CHECK: %[[S:.*]] = mapp.scale %arg0 {factor = 6.000000e+00 : f64}
  %4 = mapp.scale %x {factor = 2.0 : f64} : tensor<2x3x4xf32>
  %5 = mapp.scale %4 {factor = 3.0 : f64} : tensor<2x3x4xf32>
  // CHECK: return %[[R]], %[[T]], %[[S]]
  return %1, %3, %5 : tensor<24xf32>, tensor<4x2x3xf32>, tensor<2x3x4xf32>
}

// -----

// Transposes that compose to the identity disappear.
// CHECK-LABEL: func.func @transpose_inverse
// CHECK-NEXT: return %arg0
func.func @transpose_inverse(%x: tensor<2x3x4xf32>) -> tensor<2x3x4xf32> {
  %0 = mapp.transpose %x {perm = array<i64: 1, 2, 0>} : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
  %1 = mapp.transpose %0 {perm = array<i64: 2, 0, 1>} : (tensor<3x4x2xf32>) -> tensor<2x3x4xf32>
  return %1 : tensor<2x3x4xf32>
}

// -----

// Dropout with p > 0 and a real scale stay.
// CHECK-LABEL: func.func @kept
// CHECK: mapp.dropout
// CHECK: mapp.scale
func.func @kept(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %0 = mapp.dropout %x {p = 0.1 : f64, seed = 3 : i64} : tensor<2x8xf32>
  %1 = mapp.scale %0 {factor = 0.5 : f64} : tensor<2x8xf32>
  return %1 : tensor<2x8xf32>
}

// -----

// The fused qkv gradient: three disjoint slice_grads summed (in autodiff's
// reverse order) become one concat of the slice gradients in window order.
// CHECK-LABEL: func.func @slice_grad_sum
// CHECK-SAME: (%[[Q:.*]]: tensor<2x3x4xf32>, %[[K:.*]]: tensor<2x3x4xf32>, %[[V:.*]]: tensor<2x3x4xf32>)
// CHECK-NEXT: %[[C:.*]] = mapp.concat %[[Q]], %[[K]], %[[V]] {dim = 2 : i64, mapp.grad_of = ["qkv"]}
// CHECK-NEXT: return %[[C]]
func.func @slice_grad_sum(%dq: tensor<2x3x4xf32>, %dk: tensor<2x3x4xf32>, %dv: tensor<2x3x4xf32>) -> tensor<2x3x12xf32> {
  %0 = mapp.slice_grad %dv {dim = 2 : i64, start = 8 : i64} : (tensor<2x3x4xf32>) -> tensor<2x3x12xf32>
  %1 = mapp.slice_grad %dk {dim = 2 : i64, start = 4 : i64} : (tensor<2x3x4xf32>) -> tensor<2x3x12xf32>
  %2 = mapp.add %0, %1 : (tensor<2x3x12xf32>, tensor<2x3x12xf32>) -> tensor<2x3x12xf32>
  %3 = mapp.slice_grad %dq {dim = 2 : i64, start = 0 : i64} : (tensor<2x3x4xf32>) -> tensor<2x3x12xf32>
  %4 = mapp.add %2, %3 {mapp.grad_of = ["qkv"]} : (tensor<2x3x12xf32>, tensor<2x3x12xf32>) -> tensor<2x3x12xf32>
  return %4 : tensor<2x3x12xf32>
}

// -----

// Windows that leave gaps keep zeros there, one fill per gap.
// CHECK-LABEL: func.func @slice_grad_gaps
// CHECK-DAG: %[[Z1:.*]] = mapp.fill 0.000000e+00 : tensor<5x1xf32>
// CHECK-DAG: %[[Z2:.*]] = mapp.fill 0.000000e+00 : tensor<5x3xf32>
// CHECK: %[[C:.*]] = mapp.concat %[[Z1]], %arg1, %[[Z2]], %arg0 {dim = 1 : i64}
// CHECK-SAME: (tensor<5x1xf32>, tensor<5x2xf32>, tensor<5x3xf32>, tensor<5x2xf32>) -> tensor<5x8xf32>
// CHECK-NOT: slice_grad
// CHECK: return %[[C]]
func.func @slice_grad_gaps(%a: tensor<5x2xf32>, %b: tensor<5x2xf32>) -> tensor<5x8xf32> {
  %0 = mapp.slice_grad %a {dim = 1 : i64, start = 6 : i64} : (tensor<5x2xf32>) -> tensor<5x8xf32>
  %1 = mapp.slice_grad %b {dim = 1 : i64, start = 1 : i64} : (tensor<5x2xf32>) -> tensor<5x8xf32>
  %2 = mapp.add %0, %1 : (tensor<5x8xf32>, tensor<5x8xf32>) -> tensor<5x8xf32>
  return %2 : tensor<5x8xf32>
}

// -----

// Not rewritten: overlapping windows (a real sum), different dims, a
// slice_grad with a second reader, and a broadcast add.
// CHECK-LABEL: func.func @slice_grad_kept
// CHECK-NOT: mapp.concat
// CHECK-COUNT-4: mapp.add
func.func @slice_grad_kept(%a: tensor<4x4xf32>, %b: tensor<4x2xf32>, %c: tensor<2x8xf32>, %w: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %0 = mapp.slice_grad %a {dim = 1 : i64, start = 0 : i64} : (tensor<4x4xf32>) -> tensor<4x8xf32>
  %1 = mapp.slice_grad %a {dim = 1 : i64, start = 2 : i64} : (tensor<4x4xf32>) -> tensor<4x8xf32>
  %2 = mapp.add %0, %1 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %3 = mapp.slice_grad %b {dim = 1 : i64, start = 6 : i64} : (tensor<4x2xf32>) -> tensor<4x8xf32>
  %4 = mapp.slice_grad %c {dim = 0 : i64, start = 2 : i64} : (tensor<2x8xf32>) -> tensor<4x8xf32>
  %5 = mapp.add %3, %4 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %6 = mapp.slice_grad %b {dim = 1 : i64, start = 0 : i64} : (tensor<4x2xf32>) -> tensor<4x8xf32>
  %7 = mapp.slice_grad %b {dim = 1 : i64, start = 2 : i64} : (tensor<4x2xf32>) -> tensor<4x8xf32>
  %8 = mapp.add %6, %7 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %9 = mapp.add %6, %w : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  return %2, %5, %8, %9 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}

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

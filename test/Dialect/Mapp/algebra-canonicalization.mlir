// RUN: mapp-opt %s -canonicalize | FileCheck %s

// A broadcast or cast to the operand's own type is the operand; a constant
// nothing uses is dropped.
// CHECK-LABEL: func.func @identities
// CHECK-SAME: (%[[X:.*]]: tensor<2x8xf32>)
func.func @identities(%x: tensor<2x8xf32>) -> tensor<2x8xf32> {
  // CHECK-NOT: mapp.constant
  %c = mapp.constant {value = dense<1.5> : tensor<2x8xf32>} : tensor<2x8xf32>
  %0 = mapp.broadcast %x : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %1 = mapp.cast %0 : (tensor<2x8xf32>) -> tensor<2x8xf32>
  // CHECK-NEXT: return %[[X]]
  return %1 : tensor<2x8xf32>
}

// CHECK-LABEL: func.func @kept
func.func @kept(%x: tensor<8xf32>) -> tensor<2x8xbf16> {
  // CHECK: mapp.broadcast
  %0 = mapp.broadcast %x : (tensor<8xf32>) -> tensor<2x8xf32>
  // CHECK: mapp.cast
  %1 = mapp.cast %0 : (tensor<2x8xf32>) -> tensor<2x8xbf16>
  return %1 : tensor<2x8xbf16>
}

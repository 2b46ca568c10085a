// RUN: mapp-opt %s -mapp-autodiff | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff | mapp-opt -verify-each -o /dev/null

// A broadcast the backward reads is re-created there from its operand,
// which is saved instead: an RMS norm written with the algebra saves its
// row factor r [2, 4, 1], not the [2, 4, 8] broadcast of it (the backward
// of x * broadcast(r) reads both factors).
mapp.param @table : tensor<16x8xf32>

func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %t = mapp.param_ref @table : tensor<16x8xf32>
  %x = mapp.embedding %t, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %sq = mapp.mul %x, %x : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %ss = mapp.reduce_sum %sq {dims = array<i64: 2>} : (tensor<2x4x8xf32>) -> tensor<2x4xf32>
  %ssk = mapp.reshape %ss : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %r = mapp.rsqrt %ssk : tensor<2x4x1xf32>
  %rb = mapp.broadcast %r : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
  %y = mapp.mul %x, %rb : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %logits = mapp.linear %y, %t : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %loss = mapp.cross_entropy %logits, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// The forward saves the row factor; its values of the broadcast's shape
// are x and y (the linear's input, for the weight gradient), not the
// broadcast.
// CHECK-LABEL: func.func @train_forward
// CHECK-SAME: -> (tensor<f32>, tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<2x4x8xf32>, tensor<2x4xi32>)
// CHECK: %[[R:.*]] = mapp.rsqrt
// CHECK: return {{.*}}, %[[R]], {{.*}} :
// CHECK-LABEL: func.func @train_backward
// CHECK-SAME: %[[SAVED:arg[0-9]+]]: tensor<2x4x1xf32>
// CHECK: mapp.broadcast %[[SAVED]] : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>

// RUN: mapp-opt %s -mapp-autodiff | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff | mapp-opt -verify-each -o /dev/null

// Gradient rules of the tensor algebra (MappTensorOps.td) are built from
// the algebra itself: no *_grad op appears.
mapp.param @w : tensor<4xf32>
mapp.param @table : tensor<16x4xf32>

func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %t = mapp.param_ref @table : tensor<16x4xf32>
  %x = mapp.embedding %t, %tokens : (tensor<16x4xf32>, tensor<2x4xi32>) -> tensor<2x4x4xf32>
  %w = mapp.param_ref @w : tensor<4xf32>
  // x / broadcast(w): the broadcast's gradient sums over the repeated dims.
  %wb = mapp.broadcast %w : (tensor<4xf32>) -> tensor<2x4x4xf32>
  %d = mapp.div %x, %wb : tensor<2x4x4xf32>
  %e = mapp.exp %d : tensor<2x4x4xf32>
  %z = mapp.fill 0.0 : tensor<2x4x4xf32>
  %m = mapp.gt %d, %z : tensor<2x4x4xf32>
  %s = mapp.select %m, %e, %d : tensor<2x4x4xf32>
  %r = mapp.rsqrt %e : tensor<2x4x4xf32>
  %p = mapp.mul %s, %r : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %u = mapp.reduce_sum %p {dims = array<i64: 2>} : (tensor<2x4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.reshape %u : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %lb = mapp.broadcast %l : (tensor<2x4x1xf32>) -> tensor<2x4x16xf32>
  %loss = mapp.cross_entropy %lb, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @train_backward
// CHECK-NOT: _grad"
// reduce_sum's gradient: reshape with the summed dim kept, then broadcast.
// CHECK: mapp.reshape %{{.*}} : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
// CHECK: mapp.broadcast %{{.*}} : (tensor<2x4x1xf32>) -> tensor<2x4x4xf32>
// select's gradient goes to the chosen side only.
// CHECK: mapp.select
// CHECK: mapp.select
// The broadcast of w: summed over the two leading dims.
// CHECK: mapp.reduce_sum %{{.*}} {dims = array<i64: 0, 1>} : (tensor<2x4x4xf32>) -> tensor<4xf32>
// CHECK: mapp.grad_accumulate @w

// RUN: mapp-opt %s -mapp-autodiff | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff | mapp-opt -verify-each -o /dev/null

// reduce_max's gradient is torch.amax's: dy shared evenly among the
// elements equal to their slice's max, built from the algebra.
mapp.param @table : tensor<16x4xf32>

func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %t = mapp.param_ref @table : tensor<16x4xf32>
  %x = mapp.embedding %t, %tokens : (tensor<16x4xf32>, tensor<2x4xi32>) -> tensor<2x4x4xf32>
  %m = mapp.reduce_max %x {dims = array<i64: 2>} : (tensor<2x4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.reshape %m : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %lb = mapp.broadcast %l : (tensor<2x4x1xf32>) -> tensor<2x4x16xf32>
  %loss = mapp.cross_entropy %lb, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @train_backward
// The max (saved from the forward) repeated over the reduced dim and
// compared with x: the hits.
// CHECK: %[[MK:.*]] = mapp.reshape %arg{{[0-9]+}} : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
// CHECK-NEXT: %[[MB:.*]] = mapp.broadcast %[[MK]] : (tensor<2x4x1xf32>) -> tensor<2x4x4xf32>
// CHECK-NEXT: %[[HIT:.*]] = mapp.eq %arg{{[0-9]+}}, %[[MB]] : tensor<2x4x4xf32>
// Their count per slice shares dy.
// CHECK-NEXT: %[[N:.*]] = mapp.reduce_sum %[[HIT]] {dims = array<i64: 2>} : (tensor<2x4x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT: %[[SHARE:.*]] = mapp.div %{{.*}}, %[[N]] : tensor<2x4xf32>
// CHECK-NEXT: %[[SK:.*]] = mapp.reshape %[[SHARE]] : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
// CHECK-NEXT: %[[SB:.*]] = mapp.broadcast %[[SK]] : (tensor<2x4x1xf32>) -> tensor<2x4x4xf32>
// CHECK-NEXT: %[[DX:.*]] = mapp.mul %[[SB]], %[[HIT]]
// CHECK-NEXT: mapp.embedding_grad %[[DX]]
// CHECK: mapp.grad_accumulate @table

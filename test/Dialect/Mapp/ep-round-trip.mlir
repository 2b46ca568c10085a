// RUN: mapp-opt %s | mapp-opt | FileCheck %s
// RUN: mapp-opt %s -mlir-print-op-generic | mapp-opt | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff | FileCheck %s --check-prefix=GRAD
// Expert-parallel dispatch and combine (docs/expert-parallel.md): 8 permuted
// rows of 4 experts over an ep group of 2 members, capacity 16 rows.

// CHECK-LABEL: func.func @forward
// CHECK: %[[Y:.*]], %[[LC:.*]] = mapp.ep_dispatch %{{.*}}, %[[C:.*]] {group = "ep", members = 2 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> (tensor<16x4xf32>, tensor<2xi32>)
// CHECK: mapp.ep_dispatch %{{.*}}, %[[C]] {members = 2 : i64, ranks = array<i64: 0, 2>} : (tensor<8x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
// CHECK: mapp.ep_combine %{{.*}}, %[[C]] {group = "ep", members = 2 : i64} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>

// Each is the other's adjoint with the same counts and group.
// GRAD-LABEL: func.func @train_backward
// GRAD: mapp.ep_dispatch %{{.*}}, %{{.*}} {group = "ep", members = 2 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
// GRAD: mapp.ep_combine %{{.*}}, %{{.*}} {group = "ep", members = 2 : i64} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>

mapp.param @w : tensor<8x4xf32>
func.func @forward(%c: tensor<4xi32>, %t: tensor<8xi32>) -> tensor<f32> {
  %x = mapp.param_ref @w : tensor<8x4xf32>
  %y, %lc = mapp.ep_dispatch %x, %c {group = "ep", members = 2 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> (tensor<16x4xf32>, tensor<2xi32>)
  %y2 = mapp.ep_dispatch %x, %c {members = 2 : i64, ranks = array<i64: 0, 2>} : (tensor<8x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  %g = mapp.gelu %y : tensor<16x4xf32>
  %back = mapp.ep_combine %g, %c {group = "ep", members = 2 : i64} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>
  %l = mapp.cross_entropy %back, %t : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// RUN: mapp-opt %s | mapp-opt | FileCheck %s
// RUN: mapp-opt %s -mlir-print-op-generic | mapp-opt | FileCheck %s
// One MoE layer over N=6 tokens, H=4, E=3 experts, top-2, F=8 (docs/moe.md).

// CHECK-LABEL: func.func @moe_layer
func.func @moe_layer(%x: tensor<6x4xf32>, %logits: tensor<6x3xf32>, %fc1: tensor<3x4x8xf32>, %fc2: tensor<3x8x4xf32>) -> (tensor<6x4xf32>, tensor<f32>, tensor<f32>) {
  // CHECK: mapp.moe_router %{{.*}} {topk = 2 : i64} : (tensor<6x3xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  %p, %e = mapp.moe_router %logits {topk = 2 : i64} : (tensor<6x3xf32>) -> (tensor<6x2xf32>, tensor<6x2xi32>)
  // CHECK: mapp.moe_assign %{{.*}}, %{{.*}} {capacity = 3 : i64, num_experts = 3 : i64} : (tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<6x2xi32>, tensor<3xi32>)
  %s, %c = mapp.moe_assign %p, %e {num_experts = 3 : i64, capacity = 3 : i64} : (tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<6x2xi32>, tensor<3xi32>)
  // CHECK: mapp.moe_permute %{{.*}}, %{{.*}} : (tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<12x4xf32>
  %xp = mapp.moe_permute %x, %s : (tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<12x4xf32>
  // CHECK: mapp.moe_grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} : (tensor<12x4xf32>, tensor<3x4x8xf32>, tensor<3xi32>) -> tensor<12x8xf32>
  %h = mapp.moe_grouped_matmul %xp, %fc1, %c : (tensor<12x4xf32>, tensor<3x4x8xf32>, tensor<3xi32>) -> tensor<12x8xf32>
  %yp = mapp.moe_grouped_matmul %h, %fc2, %c : (tensor<12x8xf32>, tensor<3x8x4xf32>, tensor<3xi32>) -> tensor<12x4xf32>
  // CHECK: mapp.moe_grouped_matmul %{{.*}}, %{{.*}}, %{{.*}} {transpose_b} : (tensor<12x4xf32>, tensor<3x8x4xf32>, tensor<3xi32>) -> tensor<12x8xf32>
  %dh = mapp.moe_grouped_matmul %yp, %fc2, %c {transpose_b} : (tensor<12x4xf32>, tensor<3x8x4xf32>, tensor<3xi32>) -> tensor<12x8xf32>
  // CHECK: mapp.moe_grouped_matmul_wgrad %{{.*}}, %{{.*}}, %{{.*}} : (tensor<12x8xf32>, tensor<12x4xf32>, tensor<3xi32>) -> tensor<3x8x4xf32>
  %dw = mapp.moe_grouped_matmul_wgrad %dh, %yp, %c : (tensor<12x8xf32>, tensor<12x4xf32>, tensor<3xi32>) -> tensor<3x8x4xf32>
  // CHECK: mapp.moe_unpermute %{{.*}}, %{{.*}}, %{{.*}} : (tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  %y = mapp.moe_unpermute %yp, %p, %s : (tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  // CHECK: mapp.moe_unpermute_grad
  %dyp, %dp = mapp.moe_unpermute_grad %y, %yp, %p, %s : (tensor<6x4xf32>, tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<12x4xf32>, tensor<6x2xf32>)
  // CHECK: mapp.moe_permute_grad %{{.*}}, %{{.*}} : (tensor<12x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  %dx = mapp.moe_permute_grad %dyp, %s : (tensor<12x4xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  // CHECK: mapp.moe_router_grad %{{.*}}, %{{.*}}, %{{.*}} : (tensor<6x2xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> tensor<6x3xf32>
  %dl = mapp.moe_router_grad %dp, %p, %e : (tensor<6x2xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> tensor<6x3xf32>
  // CHECK: mapp.moe_aux_loss %{{.*}}, %{{.*}} {coeff = 1.000000e-02 : f64} : (tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<f32>
  %aux = mapp.moe_aux_loss %logits, %e {coeff = 0.01 : f64} : (tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<f32>
  // CHECK: mapp.moe_z_loss %{{.*}} {coeff = 1.000000e-03 : f64} : (tensor<6x3xf32>) -> tensor<f32>
  %z = mapp.moe_z_loss %logits {coeff = 0.001 : f64} : (tensor<6x3xf32>) -> tensor<f32>
  // CHECK: mapp.moe_aux_loss_grad
  %dla = mapp.moe_aux_loss_grad %aux, %logits, %e {coeff = 0.01 : f64} : (tensor<f32>, tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<6x3xf32>
  // CHECK: mapp.moe_z_loss_grad
  %dlz = mapp.moe_z_loss_grad %z, %logits {coeff = 0.001 : f64} : (tensor<f32>, tensor<6x3xf32>) -> tensor<6x3xf32>
  return %dx, %aux, %z : tensor<6x4xf32>, tensor<f32>, tensor<f32>
}

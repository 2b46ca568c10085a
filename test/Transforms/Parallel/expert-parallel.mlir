// RUN: mapp-opt %s -mapp-expert-parallel="ep=2" | FileCheck %s
// RUN: mapp-opt %s -mapp-expert-parallel="ep=1" | FileCheck %s --check-prefix=EP1
// RUN: mapp-opt %s -mapp-expert-parallel="ep=2" -mapp-autodiff -mapp-data-parallel="dp=4" | FileCheck %s --check-prefix=DP
// RUN: mapp-opt %s -mapp-expert-parallel="ep=2" -mapp-autodiff -mapp-data-parallel="dp=2" | FileCheck %s --check-prefix=DP2

// One MoE layer (docs/moe.md): N=8 tokens, H=4, E=4 experts, top-2, F=8,
// capacity 3 rows per expert: R = 16 permuted rows, C = min(ep·R, E·3) = 12.

// The expert weights hold this rank's E/ep experts, sharded over "ep".
// CHECK: module attributes {mapp.parallel = {ep = 2 : i64}}
// CHECK: mapp.param @router : tensor<4x4xf32>{{$}}
// CHECK: mapp.param @fc1 : tensor<2x4x8xf32> {shard_dim = 0 : i64, shard_group = "ep"}
// CHECK: mapp.param @fc2 : tensor<2x8x4xf32> {shard_dim = 0 : i64, shard_group = "ep"}
// CHECK-LABEL: func.func @forward
// CHECK: %[[S:.*]], %[[C:.*]] = mapp.moe_assign
// CHECK: %[[XP:.*]] = mapp.moe_permute %{{.*}}, %[[S]] {{.*}} -> tensor<16x4xf32>
// CHECK: %[[XD:.*]], %[[LC:.*]] = mapp.ep_dispatch %[[XP]], %[[C]] {group = "ep", mapp.name = "l0.mlp.ep_dispatch", members = 2 : i64} : (tensor<16x4xf32>, tensor<4xi32>) -> (tensor<12x4xf32>, tensor<2xi32>)
// CHECK: %[[W1:.*]] = mapp.param_ref @fc1 : tensor<2x4x8xf32>
// CHECK: %[[H:.*]] = mapp.moe_grouped_matmul %[[XD]], %[[W1]], %[[LC]] {{.*}} -> tensor<12x8xf32>
// CHECK: %[[G:.*]] = mapp.gelu %[[H]] {{.*}}: tensor<12x8xf32>
// CHECK: %[[W2:.*]] = mapp.param_ref @fc2 : tensor<2x8x4xf32>
// CHECK: %[[YD:.*]] = mapp.moe_grouped_matmul %[[G]], %[[W2]], %[[LC]] {{.*}} -> tensor<12x4xf32>
// CHECK: %[[YP:.*]] = mapp.ep_combine %[[YD]], %[[C]] {group = "ep", mapp.name = "l0.mlp.ep_combine", members = 2 : i64} : (tensor<12x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
// CHECK: mapp.moe_unpermute %[[YP]],
// The router and its losses stay on the rank's own tokens.
// CHECK: mapp.moe_aux_loss {{.*}} : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<f32>

// ep=1: nothing to do, the layout keeps no ep.
// EP1-NOT: mapp.parallel
// EP1: mapp.param @fc1 : tensor<4x4x8xf32>{{$}}
// EP1-NOT: ep_dispatch

// dp=4: dense gradients over dp, expert gradients over edp, scaled by 1/ep
// before they are accumulated; the backward carries combine (the adjoint of
// dispatch) before the expert gradients and dispatch (that of combine) after.
// DP: module attributes {mapp.parallel = {dp = 4 : i64, ep = 2 : i64}}
// DP-LABEL: func.func @train_backward
// DP: mapp.ep_dispatch {{.*}} -> tensor<12x4xf32>
// DP: mapp.scale %{{.*}} {factor = 5.000000e-01 : f64, mapp.name = "fc2.ep_grad_scale"} : tensor<2x8x4xf32>
// DP: mapp.grad_accumulate @fc2
// DP: mapp.grad_sync [@fc2, @fc1] {bucket = 1 : i64, group = "edp"}
// DP: mapp.ep_combine {{.*}} {group = "ep", {{.*}}mapp.name = "l0.mlp.ep_dispatch.grad", members = 2 : i64} : (tensor<12x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
// DP: mapp.grad_sync [@router] {bucket = 0 : i64, group = "dp"}

// dp = ep: every expert's gradient is on one rank, no edp sync.
// DP2-LABEL: func.func @train_backward
// DP2-NOT: group = "edp"
// DP2: mapp.grad_sync [@router{{.*}}] {bucket = 0 : i64, group = "dp"}
// DP2-NOT: group = "edp"

mapp.param @router : tensor<4x4xf32>
mapp.param @fc1 : tensor<4x4x8xf32>
mapp.param @fc2 : tensor<4x8x4xf32>
func.func @forward(%x: tensor<8x4xf32>, %t: tensor<8xi32>) -> tensor<f32> {
  %wr = mapp.param_ref @router : tensor<4x4xf32>
  %logits = mapp.linear %x, %wr : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %p, %e = mapp.moe_router %logits {topk = 2 : i64} : (tensor<8x4xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>)
  %s, %c = mapp.moe_assign %p, %e {num_experts = 4 : i64, capacity = 3 : i64} : (tensor<8x2xf32>, tensor<8x2xi32>) -> (tensor<8x2xi32>, tensor<4xi32>)
  %xp = mapp.moe_permute %x, %s {mapp.name = "l0.mlp.moe_permute"} : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<16x4xf32>
  %w1 = mapp.param_ref @fc1 : tensor<4x4x8xf32>
  %h = mapp.moe_grouped_matmul %xp, %w1, %c : (tensor<16x4xf32>, tensor<4x4x8xf32>, tensor<4xi32>) -> tensor<16x8xf32>
  %g = mapp.gelu %h : tensor<16x8xf32>
  %w2 = mapp.param_ref @fc2 : tensor<4x8x4xf32>
  %yp = mapp.moe_grouped_matmul %g, %w2, %c : (tensor<16x8xf32>, tensor<4x8x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  %y = mapp.moe_unpermute %yp, %p, %s {mapp.name = "l0.mlp.moe_unpermute"} : (tensor<16x4xf32>, tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<8x4xf32>
  %ce = mapp.cross_entropy %y, %t : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<f32>
  %aux = mapp.moe_aux_loss %logits, %e {coeff = 0.01 : f64} : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<f32>
  %l = mapp.add %ce, %aux : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %l : tensor<f32>
}

// RUN: mapp-opt %s -mapp-autodiff -mapp-data-parallel="dp=2 bucket-mb=0.0019" | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff -mapp-data-parallel="dp=2" | FileCheck %s --check-prefix=ONE
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-data-parallel="dp=4 bucket-mb=0.0019 zero1=true" | FileCheck %s --check-prefix=ZERO
// RUN: mapp-opt %s -mapp-autodiff -mapp-data-parallel="dp=1" | FileCheck %s --check-prefix=DP1
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2" -mapp-autodiff -mapp-data-parallel="dp=2" 2>/dev/null | FileCheck %s --check-prefix=TIED

// fc2 (1 KiB of gradients), fc1 (1 KiB) and the embedding (512 B); buckets
// of 0.0019 MiB (1992 B) close after fc2 + fc1, the rest goes in a last one.
mapp.param @emb : tensor<16x8xf32>
mapp.param @fc1 : tensor<32x8xf32>
mapp.param @fc2 : tensor<8x32xf32>

func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %e = mapp.param_ref @emb : tensor<16x8xf32>
  %x = mapp.embedding %e, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %w1 = mapp.param_ref @fc1 : tensor<32x8xf32>
  %h = mapp.linear %x, %w1 : (tensor<2x4x8xf32>, tensor<32x8xf32>) -> tensor<2x4x32xf32>
  %g = mapp.gelu %h : tensor<2x4x32xf32>
  %w2 = mapp.param_ref @fc2 : tensor<8x32xf32>
  %y = mapp.linear %g, %w2 : (tensor<2x4x32xf32>, tensor<8x32xf32>) -> tensor<2x4x8xf32>
  %e2 = mapp.param_ref @emb : tensor<16x8xf32>
  %logits = mapp.linear %y, %e2 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %l = mapp.cross_entropy %logits, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// Each grad_accumulate moves right after its gradient; a bucket's sync
// follows its last gradient, overlapping the rest of the backward.
// CHECK: module attributes {mapp.parallel = {dp = 2 : i64}}
// CHECK-LABEL: func.func @train_backward
// CHECK: %[[G2:.*]] = mapp.matmul {{.*}}mapp.wgrad{{.*}} -> tensor<8x32xf32>
// CHECK-NEXT: mapp.grad_accumulate @fc2, %[[G2]]
// CHECK: mapp.gelu_grad
// CHECK: %[[G1:.*]] = mapp.matmul {{.*}}mapp.wgrad{{.*}} -> tensor<32x8xf32>
// CHECK-NEXT: mapp.grad_accumulate @fc1, %[[G1]]
// CHECK-NEXT: mapp.grad_sync [@fc2, @fc1] {bucket = 0 : i64, group = "dp"}
// CHECK: mapp.embedding_grad
// CHECK: mapp.grad_accumulate @emb
// CHECK-NEXT: mapp.grad_sync [@emb] {bucket = 1 : i64, group = "dp"}
// CHECK-NEXT: return

// With the default 25 MiB everything is one bucket.
// ONE: mapp.grad_sync [@fc2, @fc1, @emb] {bucket = 0 : i64, group = "dp"}
// ONE-NOT: mapp.grad_sync

// ZeRO-1: reduce-scatter, sharded updates, one all-gather per bucket.
// ZERO: mapp.grad_sync [@fc2, @fc1] {bucket = 0 : i64, group = "dp", mode = "reduce_scatter"}
// ZERO: mapp.grad_sync [@emb] {bucket = 1 : i64, group = "dp", mode = "reduce_scatter"}
// ZERO-LABEL: func.func @optimizer_step
// ZERO: mapp.adamw @emb, %{{.*}} {lr = {{.*}}, mapp.zero_shard = "dp"}
// ZERO: mapp.adamw @fc2
// ZERO-SAME: mapp.zero_shard = "dp"
// ZERO: mapp.param_gather [@fc2, @fc1] {bucket = 0 : i64, group = "dp", mapp.stage = 0 : i64}
// ZERO-NEXT: mapp.param_gather [@emb] {bucket = 1 : i64, group = "dp", mapp.stage = 0 : i64}
// ZERO-NEXT: return

// DP1: module attributes {mapp.parallel = {dp = 1 : i64}}
// DP1-NOT: mapp.grad_sync

// The tied embedding is summed over the two stages at the end of each
// stage's backward, then averaged over dp.
// TIED-LABEL: func.func @backward_s0_c0
// TIED: mapp.grad_sync [{{.*}}@wpe.weight] {bucket = {{[0-9]+}} : i64, group = "dp"}
// TIED: mapp.grad_accumulate @wte.weight
// TIED-NEXT: mapp.grad_sync [@wte.weight] {bucket = 0 : i64, ranks = array<i64: 0, 1>, reduction = "sum"}
// TIED-NEXT: mapp.grad_sync [@wte.weight] {bucket = {{[0-9]+}} : i64, group = "dp"}
// TIED-NEXT: return
// TIED-LABEL: func.func @backward_s1_c0
// TIED: mapp.grad_sync [@wte.weight] {bucket = 0 : i64, ranks = array<i64: 0, 1>, reduction = "sum"}
// TIED-NEXT: mapp.grad_sync [@wte.weight] {bucket = {{[0-9]+}} : i64, group = "dp"}
// TIED-NEXT: return

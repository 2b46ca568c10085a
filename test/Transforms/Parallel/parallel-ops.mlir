// RUN: mapp-opt %s | mapp-opt | FileCheck %s

// Ops and attributes added for the Megatron passes round-trip.

// CHECK: mapp.param @qkv : tensor<12x8xf32> {shard_blocks = 3 : i64, shard_dim = 0 : i64, shard_group = "tp"}
mapp.param @qkv : tensor<12x8xf32> {shard_dim = 0 : i64, shard_group = "tp", shard_blocks = 3 : i64}
mapp.param @wte : tensor<8x8xf32> {shard_dim = 0 : i64, shard_group = "tp"}

func.func @ops(%x: tensor<2x4x8xf32>, %ids: tensor<2x4xi32>) -> tensor<f32> {
  // CHECK: mapp.copy_to_group %{{.*}} {group = "tp"} : tensor<2x4x8xf32>
  %c = mapp.copy_to_group %x {group = "tp"} : tensor<2x4x8xf32>
  // CHECK: mapp.scatter_to_group %{{.*}} {dim = 1 : i64, group = "tp"}
  %s = mapp.scatter_to_group %c {group = "tp", dim = 1 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x8xf32>
  %w = mapp.param_ref @wte : tensor<8x8xf32>
  // CHECK: mapp.embedding {{.*}} {group = "tp"}
  %e = mapp.embedding %w, %ids {group = "tp"} : (tensor<8x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  // CHECK: mapp.reduce_max
  %m = mapp.reduce_max %e {dims = array<i64: 2>} : (tensor<2x4x8xf32>) -> tensor<2x4xf32>
  // CHECK: mapp.vocab_ce_partials
  %p = mapp.vocab_ce_partials %e, %ids, %m {group = "tp"} : (tensor<2x4x8xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x2xf32>
  // CHECK: mapp.ce_from_partials
  %l = mapp.ce_from_partials %p, %ids : (tensor<2x4x2xf32>, tensor<2x4xi32>) -> tensor<f32>
  // CHECK: mapp.grad_sync [@wte, @qkv] {bucket = 0 : i64, group = "dp"}
  mapp.grad_sync [@wte, @qkv] {group = "dp", bucket = 0 : i64}
  // CHECK: mapp.param_gather [@wte] {bucket = 1 : i64, group = "dp"}
  mapp.param_gather [@wte] {group = "dp", bucket = 1 : i64}
  return %l : tensor<f32>
}

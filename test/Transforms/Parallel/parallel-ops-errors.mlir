// RUN: mapp-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{shard_group must be "tp", "dp" or "ep", got "pp"}}
mapp.param @a : tensor<4x4xf32> {shard_dim = 0 : i64, shard_group = "pp"}

// -----

// expected-error @+1 {{shard_blocks (3) must be > 0 and divide the shard dim}}
mapp.param @a : tensor<4x4xf32> {shard_dim = 0 : i64, shard_group = "tp", shard_blocks = 3 : i64}

// -----

// expected-error @+1 {{shard_dim 2 out of range for rank 2}}
mapp.param @a : tensor<4x4xf32> {shard_dim = 2 : i64, shard_group = "tp"}

// -----

func.func @f(%x: tensor<2x4x8xf32>) {
  // expected-error @+1 {{dim 4 must be a multiple of the slice 3}}
  %s = mapp.scatter_to_group %x {group = "tp", dim = 1 : i64} : (tensor<2x4x8xf32>) -> tensor<2x3x8xf32>
  return
}

// -----

mapp.param @a : tensor<4xf32>
func.func @f() {
  // expected-error @+1 {{mode must be all_reduce or reduce_scatter, got "scatter"}}
  mapp.grad_sync [@a] {group = "dp", bucket = 0 : i64, mode = "scatter"}
  return
}

// -----

func.func @f(%l: tensor<2x4x8xf32>, %t: tensor<2x4xi32>, %m: tensor<2x4xf32>) {
  // expected-error @+1 {{result must be [2,4,2]}}
  %p = mapp.vocab_ce_partials %l, %t, %m {group = "tp"} : (tensor<2x4x8xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x3xf32>
  return
}

// -----

mapp.param @a : tensor<4xf32>
func.func @f() {
  // expected-error @+1 {{refers to unknown parameter @b}}
  mapp.grad_sync [@a, @b] {group = "dp", bucket = 0 : i64}
  return
}

// -----

mapp.param @a : tensor<4xf32>
func.func @f() {
  // expected-error @+1 {{lists parameter @a twice}}
  mapp.param_gather [@a, @a] {group = "dp", bucket = 0 : i64}
  return
}

// RUN: mapp-opt %s -split-input-file -mapp-tensor-parallel="tp=3" -verify-diagnostics

mapp.param @w : tensor<24x8xf32>
mapp.param @o : tensor<8x8xf32>
func.func @forward(%x: tensor<2x4x8xf32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<24x8xf32>
  %qkv = mapp.linear %x, %w : (tensor<2x4x8xf32>, tensor<24x8xf32>) -> tensor<2x4x24xf32>
  %q = mapp.slice %qkv {dim = 2 : i64, start = 0 : i64, end = 8 : i64} : (tensor<2x4x24xf32>) -> tensor<2x4x8xf32>
  %k = mapp.slice %qkv {dim = 2 : i64, start = 8 : i64, end = 16 : i64} : (tensor<2x4x24xf32>) -> tensor<2x4x8xf32>
  %v = mapp.slice %qkv {dim = 2 : i64, start = 16 : i64, end = 24 : i64} : (tensor<2x4x24xf32>) -> tensor<2x4x8xf32>
  // expected-error @+1 {{mapp-tensor-parallel: tp=3 does not divide num_attention_heads=4}}
  %a = mapp.attention %q, %k, %v {heads = 4 : i64, scale = 1.0 : f64, causal} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %o = mapp.param_ref @o : tensor<8x8xf32>
  %y = mapp.linear %a, %o : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %l = mapp.cross_entropy %y, %t : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @w1 : tensor<8x6xf32>
mapp.param @w2 : tensor<6x8xf32>
func.func @forward(%x: tensor<2x4x6xf32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  %w1 = mapp.param_ref @w1 : tensor<8x6xf32>
  %h = mapp.linear %x, %w1 : (tensor<2x4x6xf32>, tensor<8x6xf32>) -> tensor<2x4x8xf32>
  %g = mapp.gelu %h : tensor<2x4x8xf32>
  %w2 = mapp.param_ref @w2 : tensor<6x8xf32>
  // expected-error @+1 {{tp=3 does not divide ffn_hidden_size=8}}
  %y = mapp.linear %g, %w2 : (tensor<2x4x8xf32>, tensor<6x8xf32>) -> tensor<2x4x6xf32>
  %l = mapp.cross_entropy %y, %t : (tensor<2x4x6xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @wte : tensor<16x6xf32>
func.func @forward(%tok: tensor<2x4xi32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  %w = mapp.param_ref @wte : tensor<16x6xf32>
  // expected-error @+1 {{tp=3 does not divide vocab_size=16}}
  %e = mapp.embedding %w, %tok : (tensor<16x6xf32>, tensor<2x4xi32>) -> tensor<2x4x6xf32>
  %l = mapp.cross_entropy %e, %t : (tensor<2x4x6xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{mapp-tensor-parallel: no function @forward (run the pass on the forward graph, before autodiff)}}
module {
}

// -----

// A sharded parameter read by an op the pass cannot shard.
mapp.param @wte : tensor<6x6xf32>
func.func @forward(%tok: tensor<2x4xi32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  %w = mapp.param_ref @wte : tensor<6x6xf32>
  // expected-note @+1 {{sharded for this op}}
  %e = mapp.embedding %w, %tok : (tensor<6x6xf32>, tensor<2x4xi32>) -> tensor<2x4x6xf32>
  // expected-error @+1 {{parameter @wte is tensor-parallel sharded, but this op reads it in a way the pass cannot shard}}
  %m = mapp.reduce_sum %w {dims = array<i64: 0>} : (tensor<6x6xf32>) -> tensor<6xf32>
  %s = mapp.add %e, %m : (tensor<2x4x6xf32>, tensor<6xf32>) -> tensor<2x4x6xf32>
  %l = mapp.cross_entropy %s, %t : (tensor<2x4x6xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

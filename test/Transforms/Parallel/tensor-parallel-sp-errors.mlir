// RUN: mapp-opt %s -split-input-file -mapp-tensor-parallel="tp=2 sequence-parallel=true" -verify-diagnostics

mapp.param @wte : tensor<8x4xf32>
func.func @forward(%tok: tensor<2x3xi32>, %t: tensor<2x3xi32>) -> tensor<f32> {
  %w = mapp.param_ref @wte : tensor<8x4xf32>
  %e = mapp.embedding %w, %tok : (tensor<8x4xf32>, tensor<2x3xi32>) -> tensor<2x3x4xf32>
  %l = mapp.cross_entropy %e, %t : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<f32>
  // expected-error @-2 {{tp=2 does not divide seq_length=3}}
  return %l : tensor<f32>
}

// RUN: mapp-opt %s -split-input-file -mapp-autodiff -verify-diagnostics
// Diagnostics of the ops' gradient rules (lib/Dialect/Mapp/IR/MappGradients.cpp).

mapp.param @w : tensor<4x8xf32>
func.func @forward(%x: tensor<8xf32>, %t: tensor<i32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<4x8xf32>
  // expected-error @+1 {{'mapp.linear' op gradient needs x of rank >= 2}}
  %y = mapp.linear %x, %w : (tensor<8xf32>, tensor<4x8xf32>) -> tensor<4xf32>
  %l = mapp.cross_entropy %y, %t : (tensor<4xf32>, tensor<i32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @a : tensor<2x8x3xf32>
func.func @forward(%b: tensor<8x4xf32>, %t: tensor<2x3xi32>) -> tensor<f32> {
  %a = mapp.param_ref @a : tensor<2x8x3xf32>
  // expected-error @+1 {{'mapp.matmul' op gradient of a transposed batched `a` against a 2-d `b` is not supported}}
  %c = mapp.matmul %a, %b {transpose_a} : (tensor<2x8x3xf32>, tensor<8x4xf32>) -> tensor<2x3x4xf32>
  %l = mapp.cross_entropy %c, %t : (tensor<2x3x4xf32>, tensor<2x3xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @w : tensor<2x8xf32>
func.func @forward(%t: tensor<4xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<2x8xf32>
  // expected-error @+1 {{'mapp.all_gather' op gradient is defined only over group "tp"}}
  %g = mapp.all_gather %w {group = "dp", dim = 0 : i64} : (tensor<2x8xf32>) -> tensor<4x8xf32>
  %l = mapp.cross_entropy %g, %t : (tensor<4x8xf32>, tensor<4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @w : tensor<4x8xf32>
func.func @forward(%t: tensor<2xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<4x8xf32>
  // expected-error @+1 {{'mapp.reduce_scatter' op gradient is defined only over group "tp"}}
  %s = mapp.reduce_scatter %w {group = "dp", dim = 0 : i64} : (tensor<4x8xf32>) -> tensor<2x8xf32>
  %l = mapp.cross_entropy %s, %t : (tensor<2x8xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

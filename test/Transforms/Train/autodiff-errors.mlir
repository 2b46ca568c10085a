// RUN: mapp-opt %s -split-input-file -mapp-autodiff -verify-diagnostics

mapp.param @w : tensor<4x4xf32>
func.func @forward(%t: tensor<2xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<4x4xf32>
  // expected-error @+1 {{'mapp.all_to_all' op has no gradient rule, but the loss depends on it through a parameter}}
  %r = mapp.all_to_all %w {group = "ep", split_dim = 0 : i64, concat_dim = 1 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %e = mapp.embedding %r, %t : (tensor<4x4xf32>, tensor<2xi32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %e, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// all_reduce's identity gradient holds only for sum over tp (Megatron's g).
mapp.param @w : tensor<4x4xf32>
func.func @forward(%t: tensor<2xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<4x4xf32>
  // expected-error @+1 {{'mapp.all_reduce' op gradient is defined only for reduction = "sum" over group "tp"}}
  %r = mapp.all_reduce %w {group = "dp", reduction = "avg"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  %e = mapp.embedding %r, %t : (tensor<4x4xf32>, tensor<2xi32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %e, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{mapp-autodiff: no function @forward to differentiate}}
module {
  func.func @main() {
    return
  }
}

// -----

mapp.param @w : tensor<4x4xf32>
// expected-error @+1 {{the loss does not depend on any parameter}}
func.func @forward(%t: tensor<2xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %z = mapp.fill 0.0 : tensor<2x4xf32>
  %l = mapp.cross_entropy %z, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

mapp.param @w : tensor<4x4xf32>
// expected-error @+1 {{must have one block and return one tensor<f32> loss}}
func.func @forward(%t: tensor<2xi32>) -> tensor<4x4xf32> {
  %w = mapp.param_ref @w : tensor<4x4xf32>
  return %w : tensor<4x4xf32>
}

// RUN: mapp-opt %s -split-input-file -mapp-pipeline-partition="pp=2 chunks=2" -verify-diagnostics

mapp.param @layers.0.w : tensor<4x4xf32>
mapp.param @layers.1.w : tensor<4x4xf32>
// expected-error @+1 {{mapp-pipeline-partition: pp=2 x chunks=2 = 4 pipeline stages need at least as many layers, the model has 2}}
func.func @forward(%x: tensor<2x4xf32>, %t: tensor<2xi32>) -> tensor<f32> {
  %w0 = mapp.param_ref @layers.0.w : tensor<4x4xf32>
  %h0 = mapp.linear %x, %w0 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %w1 = mapp.param_ref @layers.1.w : tensor<4x4xf32>
  %h1 = mapp.linear %h0, %w1 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %h1, %t : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{mapp-pipeline-partition: no function @forward (run the pass on the forward graph, before autodiff)}}
module {
}

// -----

mapp.param @layers.0.w : tensor<4x4xf32>
mapp.param @layers.1.w : tensor<4x4xf32>
mapp.param @layers.2.w : tensor<4x4xf32>
mapp.param @layers.3.w : tensor<4x4xf32>
func.func @forward(%x: tensor<2x4xf32>, %t: tensor<2xi32>) -> tensor<f32> {
  %w0 = mapp.param_ref @layers.0.w : tensor<4x4xf32>
  %w1 = mapp.param_ref @layers.1.w : tensor<4x4xf32>
  %w2 = mapp.param_ref @layers.2.w : tensor<4x4xf32>
  %w3 = mapp.param_ref @layers.3.w : tensor<4x4xf32>
  %h0 = mapp.linear %x, %w0 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  // expected-error @+1 {{mapp-pipeline-partition: layer 2 starts before layer 1 ends}}
  %h2 = mapp.linear %h0, %w2 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %h1 = mapp.linear %h2, %w1 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %h3 = mapp.linear %h1, %w3 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %h3, %t : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

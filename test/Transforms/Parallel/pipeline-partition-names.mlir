// Blocks found under the model's own container (LayerNames.h): the prefix
// followed by an index that starts the most names ("enc.trunk.N.", not the
// index inside block 0, "enc.trunk.0.ffn.K."), or `mapp.layer_prefix`.
// RUN: mapp-opt %s -split-input-file -mapp-pipeline-partition="pp=2" -verify-diagnostics -o /dev/null

mapp.param @emb : tensor<4x4xf32>
mapp.param @enc.trunk.0.ffn.0.w : tensor<4x4xf32>
mapp.param @enc.trunk.0.ffn.1.w : tensor<4x4xf32>
mapp.param @enc.trunk.0.ffn.2.w : tensor<4x4xf32>
mapp.param @enc.trunk.1.w : tensor<4x4xf32>
// expected-remark @+1 {{[stage 0 chunk 0: layers 0-0, 256 FLOPs] [stage 1 chunk 0: layers 1-1, 104 FLOPs]}}
func.func @forward(%x: tensor<2x4xf32>, %t: tensor<2xi32>) -> tensor<f32> {
  %e = mapp.param_ref @emb : tensor<4x4xf32>
  %h = mapp.linear %x, %e : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %a = mapp.param_ref @enc.trunk.0.ffn.0.w : tensor<4x4xf32>
  %b = mapp.param_ref @enc.trunk.0.ffn.1.w : tensor<4x4xf32>
  %c = mapp.param_ref @enc.trunk.0.ffn.2.w : tensor<4x4xf32>
  %h0 = mapp.linear %h, %a {mapp.name = "enc.trunk.0.ffn.0"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %h1 = mapp.linear %h0, %b {mapp.name = "enc.trunk.0.ffn.1"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %h2 = mapp.linear %h1, %c {mapp.name = "enc.trunk.0.ffn.2"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %w = mapp.param_ref @enc.trunk.1.w : tensor<4x4xf32>
  %h3 = mapp.linear %h2, %w {mapp.name = "enc.trunk.1.fc"} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %h3, %t : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// The module's word over inference: no name starts with "blk.".
module attributes {mapp.layer_prefix = "blk."} {
mapp.param @layers.0.w : tensor<4x4xf32>
mapp.param @layers.1.w : tensor<4x4xf32>
// expected-error @+1 {{pipeline stages need at least as many layers, the model has 0 (blocks named blk.N)}}
func.func @forward(%x: tensor<2x4xf32>, %t: tensor<2xi32>) -> tensor<f32> {
  %w0 = mapp.param_ref @layers.0.w : tensor<4x4xf32>
  %h0 = mapp.linear %x, %w0 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %w1 = mapp.param_ref @layers.1.w : tensor<4x4xf32>
  %h1 = mapp.linear %h0, %w1 : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %h1, %t : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
}

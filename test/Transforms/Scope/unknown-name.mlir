// A probe on a name that does not exist: a located error (the module, and
// the spec's file:line:col) listing the nearest names.
// RUN: mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/unknown-name.json" -verify-diagnostics

// expected-error@+1 {{unknown-name.json:3:12: no value is named 'layers.0.mlp.fc3'; did you mean 'layers.0.mlp.fc1', 'layers.0.mlp.fc2', 'layers.0.mlp'?}}
module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
    %a = mapp.linear %x, %w {mapp.name = "layers.0.mlp.fc1"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %b = mapp.linear %a, %w {mapp.name = "layers.0.mlp.fc2"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %b : tensor<2x4x8xf32>
  }
}

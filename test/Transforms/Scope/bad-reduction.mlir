// RUN: mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-reduction.json" -verify-diagnostics

// expected-error@+1 {{bad-reduction.json:1:22: probe 'layers.0.mlp.fc1': unknown reduction 'median' (expected max, min, mean, std, absmax, sparsity, hist, topk, sketch, raw, attn or lens)}}
module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
    %a = mapp.linear %x, %w {mapp.name = "layers.0.mlp.fc1"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %a : tensor<2x4x8xf32>
  }
}

// RUN: mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-spec.json" -verify-diagnostics

// expected-error@+1 {{bad-spec.json:1:22: unknown key 'buckets' in probe (allowed: name, reduce, every, tokens, bins, range, k, dim, seed, eps, cap)}}
module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
    %a = mapp.linear %x, %w {mapp.name = "layers.0.mlp.fc1"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %a : tensor<2x4x8xf32>
  }
}

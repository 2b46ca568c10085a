// Every other kind of bad spec is one clear, located message.
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-json.json" 2>&1 | FileCheck %s --check-prefix=JSON
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-tokens.json" 2>&1 | FileCheck %s --check-prefix=TOKENS
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-storage.json" 2>&1 | FileCheck %s --check-prefix=STORAGE
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-kind.json" 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/missing.json" 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not mapp-opt %s -mapp-insert-probes 2>&1 | FileCheck %s --check-prefix=NOSPEC

// JSON: bad-json.json: not valid JSON
// TOKENS: bad-tokens.json:1:22: token selection 2:9 is outside positions 0..3 of 'layers.0.mlp.fc1'
// STORAGE: bad-storage.json:1:29: a storage perturbation needs a parameter name
// KIND: bad-kind.json:1:29: perturbation 'layers.0.mlp.fc1': unknown kind 'dropout'
// MISSING: cannot read probe spec '{{.*}}missing.json'
// NOSPEC: mapp-insert-probes: give spec=FILE (JSON or YAML)
module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
    %a = mapp.linear %x, %w {mapp.name = "layers.0.mlp.fc1"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %a : tensor<2x4x8xf32>
  }
}

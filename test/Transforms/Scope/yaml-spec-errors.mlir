// A malformed or ill-typed YAML spec gets the same kind of located message
// as a JSON one (spec-errors.mlir, bad-spec.mlir).
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-yaml.yaml" 2>&1 | FileCheck %s --check-prefix=SYNTAX
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-key.yaml" 2>&1 | FileCheck %s --check-prefix=KEY
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-type.yaml" 2>&1 | FileCheck %s --check-prefix=TYPE
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-kind.yaml" 2>&1 | FileCheck %s --check-prefix=KIND
// RUN: not mapp-opt %s -mapp-insert-probes="spec=%S/Inputs/bad-top.yaml" 2>&1 | FileCheck %s --check-prefix=TOP

// SYNTAX: error: mapp-insert-probes: {{.*}}bad-yaml.yaml:{{[34]}}:{{[0-9]+}}: not valid YAML: {{.+}}
// KEY: error: mapp-insert-probes: {{.*}}bad-key.yaml:3:11: unknown key 'buckets' in probe (allowed: name, reduce, every, tokens, bins, range, k, dim, seed, eps, cap)
// TYPE: error: mapp-insert-probes: {{.*}}bad-type.yaml:4:11: "every" must be an integer >= 1
// KIND: error: mapp-insert-probes: {{.*}}bad-kind.yaml:2:12: perturbation 'layers.0.mlp.fc1': unknown kind 'dropout'
// TOP: error: mapp-insert-probes: {{.*}}bad-top.yaml:1:1: the spec must be an object with "probes" and/or "perturbations"
module {
  func.func @forward(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
    %a = mapp.linear %x, %w {mapp.name = "layers.0.mlp.fc1"} : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    return %a : tensor<2x4x8xf32>
  }
}

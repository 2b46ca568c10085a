// RUN: mapp-opt %s -split-input-file -mapp-expert-parallel="ep=2" -verify-diagnostics
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=3" -o /dev/null 2>&1 | FileCheck %s --check-prefix=DIV
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=0" -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=-2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=NEG
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=1.5" -o /dev/null 2>&1 | FileCheck %s --check-prefix=FRAC
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=4 dp=2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=DP
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=2" -mapp-autodiff -mapp-data-parallel="dp=3" -o /dev/null 2>&1 | FileCheck %s --check-prefix=DPPASS
// RUN: not mapp-opt %S/expert-parallel.mlir -mapp-expert-parallel="ep=2" -mapp-autodiff -mapp-optimizer -mapp-data-parallel="dp=4 zero1=true" -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZERO1

// DIV: expert-parallel.mlir:58:{{[0-9]+}}: error: mapp-expert-parallel: 4 experts (num_moe_experts) cannot be split evenly over ep=3
// ZERO: error: mapp-expert-parallel: ep must be >= 1, got 0
// NEG: error: mapp-expert-parallel: ep must be >= 1, got -2
// FRAC: for the --ep option: '1.5' value invalid for long argument!
// DP: error: mapp-expert-parallel: ep=4 does not divide dp=2 (expert parallelism lives inside the data-parallel group)
// DPPASS: error: mapp-data-parallel: ep=2 does not divide dp=3
// ZERO1: error: mapp-data-parallel: zero1 with ep=2 is not supported

// ep > 1 on a dense model: a clear error, not a silent no-op.
mapp.param @w : tensor<4x4xf32>
// expected-error @+1 {{mapp-expert-parallel: ep=2 but the model has no MoE layer (no mapp.moe_permute in @forward): set num_moe_experts or leave ep at 1}}
func.func @forward(%x: tensor<8x4xf32>, %t: tensor<8xi32>) -> tensor<f32> {
  %w = mapp.param_ref @w : tensor<4x4xf32>
  %y = mapp.linear %x, %w : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %l = mapp.cross_entropy %y, %t : (tensor<8x4xf32>, tensor<8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// An op the pass cannot run on dispatched rows (it mixes rows).
mapp.param @fc1 : tensor<4x4x8xf32>
func.func @forward(%x: tensor<8x4xf32>, %p: tensor<8x2xf32>, %e: tensor<8x2xi32>) -> tensor<8x4xf32> {
  %s, %c = mapp.moe_assign %p, %e {num_experts = 4 : i64} : (tensor<8x2xf32>, tensor<8x2xi32>) -> (tensor<8x2xi32>, tensor<4xi32>)
  // expected-note @+1 {{the MoE layer's moe_permute}}
  %xp = mapp.moe_permute %x, %s : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<16x4xf32>
  // expected-error @+1 {{'mapp.transpose' in the expert computation is not supported}}
  %tr = mapp.transpose %xp {perm = array<i64: 1, 0>} : (tensor<16x4xf32>) -> tensor<4x16xf32>
  %y = mapp.moe_unpermute %xp, %p, %s : (tensor<16x4xf32>, tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}

// -----

// An expert weight used outside the expert computation.
mapp.param @fc1 : tensor<4x4x4xf32>
func.func @forward(%x: tensor<8x4xf32>, %p: tensor<8x2xf32>, %e: tensor<8x2xi32>) -> (tensor<8x4xf32>, tensor<4x4x4xf32>) {
  %s, %c = mapp.moe_assign %p, %e {num_experts = 4 : i64} : (tensor<8x2xf32>, tensor<8x2xi32>) -> (tensor<8x2xi32>, tensor<4xi32>)
  %xp = mapp.moe_permute %x, %s : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<16x4xf32>
  %w = mapp.param_ref @fc1 : tensor<4x4x4xf32>
  // expected-note @+1 {{expert use}}
  %h = mapp.moe_grouped_matmul %xp, %w, %c : (tensor<16x4xf32>, tensor<4x4x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  %y = mapp.moe_unpermute %h, %p, %s : (tensor<16x4xf32>, tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<8x4xf32>
  // expected-error @+1 {{expert weight @fc1 is used outside a grouped matmul of an expert computation (ep shards it)}}
  %w2 = mapp.scale %w {factor = 2.0 : f64} : tensor<4x4x4xf32>
  return %y, %w2 : tensor<8x4xf32>, tensor<4x4x4xf32>
}

// -----

// Another tensor enters the expert computation.
mapp.param @fc1 : tensor<4x4x4xf32>
func.func @forward(%x: tensor<8x4xf32>, %p: tensor<8x2xf32>, %e: tensor<8x2xi32>, %b: tensor<16x4xf32>) -> tensor<8x4xf32> {
  %s, %c = mapp.moe_assign %p, %e {num_experts = 4 : i64} : (tensor<8x2xf32>, tensor<8x2xi32>) -> (tensor<8x2xi32>, tensor<4xi32>)
  %xp = mapp.moe_permute %x, %s : (tensor<8x4xf32>, tensor<8x2xi32>) -> tensor<16x4xf32>
  %w = mapp.param_ref @fc1 : tensor<4x4x4xf32>
  %h = mapp.moe_grouped_matmul %xp, %w, %c : (tensor<16x4xf32>, tensor<4x4x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  // expected-error @+1 {{operand #1 comes from outside the expert computation (only the permuted rows may enter it)}}
  %h2 = mapp.add %h, %b : (tensor<16x4xf32>, tensor<16x4xf32>) -> tensor<16x4xf32>
  %y = mapp.moe_unpermute %h2, %p, %s : (tensor<16x4xf32>, tensor<8x2xf32>, tensor<8x2xi32>) -> tensor<8x4xf32>
  return %y : tensor<8x4xf32>
}

// RUN: mapp-opt %s -split-input-file -verify-diagnostics

// mapp.fused's verifier (MappFusedOps.cpp) checks the program with the
// parser the runtime uses (mapp/rt/FusedProgram.h).

func.func @unknown_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 1: unknown op 'frobnicate'}}
  %0 = mapp.fused %x {program = "neg(%i0); frobnicate(%0)", domain = array<i64: 4>, outputs = array<i64: 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @input_out_of_range(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 0: input %i1 out of range (the op has 1 operands)}}
  %0 = mapp.fused %x {program = "add(%i0, %i1)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @later_statement(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 0: %1 does not name an earlier statement}}
  %0 = mapp.fused %x {program = "neg(%1); neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 1>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_not_last(%x: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 1: reduce_sum must be the last statement}}
  %0 = mapp.fused %x {program = "reduce_sum[0](%i0); neg(%0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @no_broadcast(%x: tensor<3xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'mapp.fused' op operand 0 of type 'tensor<3xf32>' does not broadcast to the domain [2, 4]}}
  %0 = mapp.fused %x {program = "neg(%i0)", domain = array<i64: 2, 4>, outputs = array<i64: 0>} : (tensor<3xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @wrong_result_shape(%x: tensor<2x4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op result 0 of type 'tensor<4xf32>' must have shape [2] (statement 1)}}
  %0 = mapp.fused %x {program = "exp(%i0); reduce_sum[1](%0)", domain = array<i64: 2, 4>, outputs = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @missing_immediate(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 0: scale needs an immediate in [...]}}
  %0 = mapp.fused %x {program = "scale(%i0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @outputs_count(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op has 1 results but 2 outputs}}
  %0 = mapp.fused %x {program = "neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 0, 0>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @output_past_program(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op output 0 names statement 3, the program has 1}}
  %0 = mapp.fused %x {program = "neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 3>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_outside_domain(%x: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'mapp.fused' op reduce_sum dim 2 is outside the domain [4]}}
  %0 = mapp.fused %x {program = "reduce_sum[2](%i0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

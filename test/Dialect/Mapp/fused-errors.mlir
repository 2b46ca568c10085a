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

// A reduce_sum followed by statements sums the rows (the trailing dims).
func.func @reduce_not_last(%x: tensor<4x2xf32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: statement 0: a reduce_sum inside a row program (a reduce_max, or a reduce_sum not the only, last statement) reduces the rows, the trailing dims of the domain [4, 2]}}
  %0 = mapp.fused %x {program = "reduce_sum[0](%i0); mul(%i0, %0)", domain = array<i64: 4, 2>, outputs = array<i64: 1>} : (tensor<4x2xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

func.func @row_reads_element(%x: tensor<4x2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 2: a row statement reads %0, a value per element (row statements read row values and operands)}}
  %0 = mapp.fused %x {program = "exp(%i0); reduce_sum[1](%0); row mul(%1, %0)", domain = array<i64: 4, 2>, outputs = array<i64: 2>} : (tensor<4x2xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_of_row_value(%x: tensor<4x2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 2: reduce_sum reduces values per element; %1 is a row value}}
  %0 = mapp.fused %x {program = "exp(%i0); reduce_sum[1](%0); reduce_sum[1](%1)", domain = array<i64: 4, 2>, outputs = array<i64: 2>} : (tensor<4x2xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @operand_both_levels(%x: tensor<4x2xf32>, %e: tensor<f32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 3: operand %i1 is read per element here and per row by statement 2 (pass it as two operands)}}
  %0 = mapp.fused %x, %e {program = "exp(%i0); reduce_sum[1](%0); row add(%1, %i1); add(%2, %i1)", domain = array<i64: 4, 2>, outputs = array<i64: 3>} : (tensor<4x2xf32>, tensor<f32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

func.func @different_rows(%x: tensor<4x2x3xf32>) -> tensor<4x2x3xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 2: the reductions of a row program reduce the same dims (the rows), got [2] and [1,2]}}
  %0 = mapp.fused %x {program = "reduce_sum[2](%i0); mul(%i0, %0); reduce_sum[1,2](%1); mul(%1, %2)", domain = array<i64: 4, 2, 3>, outputs = array<i64: 3>} : (tensor<4x2x3xf32>) -> tensor<4x2x3xf32>
  return %0 : tensor<4x2x3xf32>
}

// -----

// reduce_max is a row reduction only: over the trailing dims.
func.func @reduce_max_not_rows(%x: tensor<4x2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: statement 1: a reduce_max inside a row program (a reduce_max, or a reduce_sum not the only, last statement) reduces the rows, the trailing dims of the domain [4, 2]}}
  %0 = mapp.fused %x {program = "exp(%i0); reduce_max[0](%0)", domain = array<i64: 4, 2>, outputs = array<i64: 1>} : (tensor<4x2xf32>) -> tensor<2xf32>
  return %0 : tensor<2xf32>
}

// -----

func.func @max_of_row_value(%x: tensor<4x2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 2: reduce_max reduces values per element; %1 is a row value}}
  %0 = mapp.fused %x {program = "exp(%i0); reduce_sum[1](%0); reduce_max[1](%1)", domain = array<i64: 4, 2>, outputs = array<i64: 2>} : (tensor<4x2xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @row_reduce_max(%x: tensor<4x2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: statement 1: reduce_max reduces the domain's elements; it is not a row statement}}
  %0 = mapp.fused %x {program = "exp(%i0); row reduce_max[1](%0)", domain = array<i64: 4, 2>, outputs = array<i64: 1>} : (tensor<4x2xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @row_without_reduce(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op program: row statements need a reduce_sum or reduce_max over the rows (the trailing dims)}}
  %0 = mapp.fused %x {program = "row neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// An operand read per row has extent 1 along the rows' dims.
func.func @row_operand_spans_row(%x: tensor<4x2xf32>, %s: tensor<4x2xf32>) -> tensor<4x2xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: operand 1 of shape [4, 2] is read per row and does not broadcast to the rows [4] with the row dims kept as 1}}
  %0 = mapp.fused %x, %s {program = "reduce_sum[1](%i0); row mul(%0, %i1); mul(%i0, %1)", domain = array<i64: 4, 2>, outputs = array<i64: 2>} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
  return %0 : tensor<4x2xf32>
}

// -----

func.func @row_result_shape(%x: tensor<4x2xf32>) -> (tensor<4x2xf32>, tensor<2xf32>) {
  // expected-error @+1 {{'mapp.fused' op shapes: result 1 of shape [2] must have shape [4] or [4, 1] (statement 1)}}
  %0:2 = mapp.fused %x {program = "reduce_sum[1](%i0); row rsqrt(%0); mul(%i0, %1)", domain = array<i64: 4, 2>, outputs = array<i64: 2, 1>} : (tensor<4x2xf32>) -> (tensor<4x2xf32>, tensor<2xf32>)
  return %0#0, %0#1 : tensor<4x2xf32>, tensor<2xf32>
}

// -----

func.func @no_broadcast(%x: tensor<3xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: operand 0 of shape [3] does not broadcast to the domain [2, 4]}}
  %0 = mapp.fused %x {program = "neg(%i0)", domain = array<i64: 2, 4>, outputs = array<i64: 0>} : (tensor<3xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @wrong_result_shape(%x: tensor<2x4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: result 0 of shape [4] must have shape [2] (statement 1)}}
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
  // expected-error @+1 {{'mapp.fused' op shapes: output 0 names statement 3, the program has 1}}
  %0 = mapp.fused %x {program = "neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 3>} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reduce_outside_domain(%x: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{'mapp.fused' op shapes: reduce_sum dim 2 is outside the domain [4]}}
  %0 = mapp.fused %x {program = "reduce_sum[2](%i0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// Over a fused program's limits (FusedDevice.h: 32 operands, 16 outputs,
// rank 8): the generated kernels could not take it.
func.func @too_many_operands(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'mapp.fused' op shapes: a domain of rank 1, 33 operands and 1 outputs exceed a fused program's limits (rank 8, 32 operands, 16 outputs)}}
  %0 = mapp.fused %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x, %x {program = "neg(%i0)", domain = array<i64: 4>, outputs = array<i64: 0>} : (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

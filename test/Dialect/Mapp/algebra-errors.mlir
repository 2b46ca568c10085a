// RUN: mapp-opt %s -split-input-file -verify-diagnostics

func.func @broadcast_mismatch(%x: tensor<3xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{operand dim 0 of size 3 is neither 1 nor the result's 4 (NumPy broadcasting aligns trailing dims)}}
  %0 = mapp.broadcast %x : (tensor<3xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @broadcast_rank(%x: tensor<2x4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{operand of rank 2 cannot broadcast to rank 1}}
  %0 = mapp.broadcast %x : (tensor<2x4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @broadcast_elem(%x: tensor<4xf32>) -> tensor<2x4xbf16> {
  // expected-error @+1 {{result element type 'bf16' differs from the operand's 'f32'}}
  %0 = mapp.broadcast %x : (tensor<4xf32>) -> tensor<2x4xbf16>
  return %0 : tensor<2x4xbf16>
}

// -----

func.func @constant_type() -> tensor<2x4xf32> {
  // expected-error @+1 {{value of type 'tensor<4xf32>' does not match the result type 'tensor<2x4xf32>'}}
  %0 = mapp.constant {value = dense<1.0> : tensor<4xf32>} : tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @cast_shape(%x: tensor<8xi32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{changes the shape 'tensor<8xi32>' -> 'tensor<2x4xf32>' (a cast converts elements only)}}
  %0 = mapp.cast %x : (tensor<8xi32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @implicit_broadcast(%x: tensor<2x4xf32>, %y: tensor<4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %0 = "mapp.sub"(%x, %y) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @select_types(%c: tensor<2x4xf32>, %x: tensor<2x4xf32>, %y: tensor<2x4xbf16>) -> tensor<2x4xf32> {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %0 = "mapp.select"(%c, %x, %y) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xbf16>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}

// -----

func.func @cast_to_int(%x: tensor<4xf32>) -> tensor<4xi32> {
  // expected-error @+1 {{result #0 must be ranked tensor of}}
  %0 = mapp.cast %x : (tensor<4xf32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

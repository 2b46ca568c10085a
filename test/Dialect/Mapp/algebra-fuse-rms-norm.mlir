// RUN: mapp-opt %s -canonicalize -split-input-file | FileCheck %s
// Recognition as canonicalization: an RMS norm written with the algebra
// (what `mapp.export --no-recognize` emits for x * rsqrt(mean(x²) + eps) * w)
// becomes mapp.rms_norm (eps 1e-5, the default, is not printed).

// CHECK-LABEL: func.func @written_out
// CHECK-SAME: (%[[X:.*]]: tensor<2x8x16xf32>, %[[W:.*]]: tensor<16xf32>)
// CHECK-NEXT: %[[Y:.*]] = mapp.rms_norm %[[X]], %[[W]] : (tensor<2x8x16xf32>, tensor<16xf32>)
// CHECK-NEXT: return %[[Y]]
func.func @written_out(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>) -> tensor<2x8x16xf32> {
  %sq = mapp.pow %x {exponent = 2.0 : f64} : tensor<2x8x16xf32>
  %s = mapp.reduce_sum %sq {dims = array<i64: 2>} : (tensor<2x8x16xf32>) -> tensor<2x8xf32>
  %k = mapp.reshape %s : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %m = mapp.scale %k {factor = 0.0625 : f64} : tensor<2x8x1xf32>
  %eps = mapp.fill 1.0e-5 : tensor<f32>
  %a = mapp.add %m, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
  %q = mapp.rsqrt %a : tensor<2x8x1xf32>
  %b = mapp.broadcast %q : (tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %n = mapp.mul %x, %b : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = mapp.mul %n, %w : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return %y : tensor<2x8x16xf32>
}

// -----

// x·x instead of pow, the broadcast on the left.
// CHECK-LABEL: func.func @square_by_mul
// CHECK: mapp.rms_norm
// CHECK-NOT: mapp.rsqrt
func.func @square_by_mul(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> tensor<4x8xf32> {
  %sq = mapp.mul %x, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %s = mapp.reduce_sum %sq {dims = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4xf32>
  %k = mapp.reshape %s : (tensor<4xf32>) -> tensor<4x1xf32>
  %m = mapp.scale %k {factor = 0.125 : f64} : tensor<4x1xf32>
  %eps = mapp.fill 1.0e-6 : tensor<f32>
  %a = mapp.add %m, %eps : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
  %q = mapp.rsqrt %a : tensor<4x1xf32>
  %b = mapp.broadcast %q : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %n = mapp.mul %b, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = mapp.mul %n, %w : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}

// -----

// Not an RMS norm: the mean over the wrong count (1/4 of 8 columns), or
// the normalized value read elsewhere too: nothing is fused.
// CHECK-LABEL: func.func @not_a_norm
// CHECK-NOT: mapp.rms_norm
func.func @not_a_norm(%x: tensor<4x8xf32>, %w: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %sq = mapp.mul %x, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %s = mapp.reduce_sum %sq {dims = array<i64: 1>} : (tensor<4x8xf32>) -> tensor<4xf32>
  %k = mapp.reshape %s : (tensor<4xf32>) -> tensor<4x1xf32>
  %m = mapp.scale %k {factor = 0.25 : f64} : tensor<4x1xf32>
  %eps = mapp.fill 1.0e-6 : tensor<f32>
  %a = mapp.add %m, %eps : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
  %q = mapp.rsqrt %a : tensor<4x1xf32>
  %b = mapp.broadcast %q : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %n = mapp.mul %b, %x : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = mapp.mul %n, %w : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %m2 = mapp.scale %k {factor = 0.125 : f64} : tensor<4x1xf32>
  %a2 = mapp.add %m2, %eps : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32>
  %q2 = mapp.rsqrt %a2 : tensor<4x1xf32>
  %b2 = mapp.broadcast %q2 : (tensor<4x1xf32>) -> tensor<4x8xf32>
  %n2 = mapp.mul %x, %b2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %y2 = mapp.mul %n2, %w : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %z = mapp.add %y2, %n2 : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y, %z : tensor<4x8xf32>, tensor<4x8xf32>
}

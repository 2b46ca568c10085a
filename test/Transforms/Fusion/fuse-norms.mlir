// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s
// RUN: mapp-opt %s -mapp-fuse -split-input-file | mapp-opt -split-input-file -verify-each -o /dev/null

// A reduce_sum over the trailing dims in the middle of a region (issue 37,
// docs/fusion.md "What fuses"): a norm is one region, forward and backward,
// as the exporter and --mapp-autodiff write it (reduce_sum, a reshape to
// the kept-dims shape, the row ops, a broadcast back).

// RMS norm, x·rsqrt(mean(x²) + eps)·w, torch's keepdim form; the row
// factor is also a result (saved for the backward).
// CHECK-LABEL: func.func @rms_norm
func.func @rms_norm(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %wo: tensor<4x16xf32>)
    -> (tensor<2x8x4xf32>, tensor<2x8x1xf32>) {
  // CHECK-NEXT: %[[EPS:.*]] = mapp.fill
  // CHECK-NEXT: %[[F:.*]]:2 = mapp.fused %arg0, %[[EPS]], %arg1 {domain = array<i64: 2, 8, 16>, outputs = array<i64: 4, 6>, program = "pow[2](%i0); reduce_sum[2](%0); row scale[0.0625](%1); row add(%2, %i1); row rsqrt(%3); mul(%i0, %4); mul(%5, %i2)"} : (tensor<2x8x16xf32>, tensor<f32>, tensor<16xf32>) -> (tensor<2x8x1xf32>, tensor<2x8x16xf32>)
  // CHECK-NEXT: %[[O:.*]] = mapp.linear %[[F]]#1
  // CHECK-NEXT: return %[[O]], %[[F]]#0
  %sq = mapp.pow %x {exponent = 2.0 : f64} : tensor<2x8x16xf32>
  %ss = mapp.reduce_sum %sq {dims = array<i64: 2>} : (tensor<2x8x16xf32>) -> tensor<2x8xf32>
  %ssk = mapp.reshape %ss : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %ms = mapp.scale %ssk {factor = 0.0625 : f64} : tensor<2x8x1xf32>
  %eps = mapp.fill 1.0e-5 : tensor<f32>
  %v = mapp.add %ms, %eps : (tensor<2x8x1xf32>, tensor<f32>) -> tensor<2x8x1xf32>
  %r = mapp.rsqrt %v : tensor<2x8x1xf32>
  %rb = mapp.broadcast %r : (tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %n = mapp.mul %x, %rb : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %y = mapp.mul %n, %w : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %o = mapp.linear %y, %wo : (tensor<2x8x16xf32>, tensor<4x16xf32>) -> tensor<2x8x4xf32>
  return %o, %r : tensor<2x8x4xf32>, tensor<2x8x1xf32>
}

// -----

// Its backward as --mapp-autodiff writes it (dy the output gradient, r the
// saved row factor): dx = r·(dy·w) − x·r³·Σ(dy·w·x)/C is one region with
// its row sum in the middle; the weight's gradient, a sum over the leading
// dims, ends a region of its own; the eps gradient is dead (removed).
// CHECK-LABEL: func.func @rms_norm_backward
func.func @rms_norm_backward(%dy: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %n: tensor<2x8x16xf32>,
                             %r: tensor<2x8x1xf32>, %rb: tensor<2x8x16xf32>, %w: tensor<16xf32>)
    -> (tensor<2x8x16xf32>, tensor<16xf32>) {
  // CHECK-NEXT: %[[G:.*]] = mapp.fused %arg0, %arg2 {domain = array<i64: 2, 8, 16>, outputs = array<i64: 1>, program = "mul(%i0, %i1); reduce_sum[0,1](%0)"}
  // CHECK-NEXT: %[[DX:.*]] = mapp.fused %arg0, %arg5, %arg4, %arg1, %arg3 {domain = array<i64: 2, 8, 16>, outputs = array<i64: 11>, program = "mul(%i0, %i1); mul(%0, %i2); mul(%0, %i3); reduce_sum[2](%2); row mul(%i4, %i4); row mul(%3, %i4); row mul(%4, %5); row scale[-0.5](%6); row scale[0.0625](%7); mul(%8, %i3); scale[2](%9); add(%1, %10)"}
  // CHECK-NEXT: return %[[DX]], %[[G]]
  %dn = mapp.mul %dy, %w : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %dwp = mapp.mul %dy, %n : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %dw = mapp.reduce_sum %dwp {dims = array<i64: 0, 1>} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  %dx1 = mapp.mul %dn, %rb : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %drp = mapp.mul %dn, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %dr0 = mapp.reduce_sum %drp {dims = array<i64: 2>} : (tensor<2x8x16xf32>) -> tensor<2x8xf32>
  %dr = mapp.reshape %dr0 : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %r2 = mapp.mul %r, %r : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
  %t1 = mapp.mul %dr, %r : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
  // The chain over the rows (r²) comes first: the op still joins the norm.
  %t2 = mapp.mul %r2, %t1 : (tensor<2x8x1xf32>, tensor<2x8x1xf32>) -> tensor<2x8x1xf32>
  %dv = mapp.scale %t2 {factor = -5.000000e-01 : f64} : tensor<2x8x1xf32>
  %deps = mapp.reduce_sum %dv {dims = array<i64: 0, 1, 2>} : (tensor<2x8x1xf32>) -> tensor<f32>
  %dms = mapp.scale %dv {factor = 6.250000e-02 : f64} : tensor<2x8x1xf32>
  %dss0 = mapp.reshape %dms : (tensor<2x8x1xf32>) -> tensor<2x8xf32>
  %dss = mapp.reshape %dss0 : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %dssb = mapp.broadcast %dss : (tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %dsq = mapp.mul %dssb, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %dx2 = mapp.scale %dsq {factor = 2.000000e+00 : f64} : tensor<2x8x16xf32>
  %dx = mapp.add %dx1, %dx2 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return %dx, %dw : tensor<2x8x16xf32>, tensor<16xf32>
}

// -----

// LayerNorm, (x − mean)/sqrt(var + eps)·w + b, with the row ops on the
// rows' shape [4, 6] (no kept dim): two row sums in one region; the [4, 6]
// eps is read per row through a reshape to [4, 6, 1].
// CHECK-LABEL: func.func @layer_norm
func.func @layer_norm(%x: tensor<4x6x10xf32>, %w: tensor<10xf32>, %b: tensor<10xf32>,
                      %wo: tensor<3x10xf32>) -> tensor<4x6x3xf32> {
  // CHECK-NEXT: %[[EPS:.*]] = mapp.fill
  // CHECK-NEXT: %[[E:.*]] = mapp.reshape %[[EPS]] : (tensor<4x6xf32>) -> tensor<4x6x1xf32>
  // CHECK-NEXT: %[[Y:.*]] = mapp.fused %arg0, %[[E]], %arg1, %arg2 {domain = array<i64: 4, 6, 10>, outputs = array<i64: 10>, program = "reduce_sum[2](%i0); row scale[0.10000000000000001](%0); sub(%i0, %1); mul(%2, %2); reduce_sum[2](%3); row scale[0.10000000000000001](%4); row add(%5, %i1); row sqrt(%6); div(%2, %7); mul(%8, %i2); add(%9, %i3)"}
  // CHECK-NEXT: mapp.linear %[[Y]]
  %s = mapp.reduce_sum %x {dims = array<i64: 2>} : (tensor<4x6x10xf32>) -> tensor<4x6xf32>
  %mean = mapp.scale %s {factor = 0.1 : f64} : tensor<4x6xf32>
  %meank = mapp.reshape %mean : (tensor<4x6xf32>) -> tensor<4x6x1xf32>
  %meanb = mapp.broadcast %meank : (tensor<4x6x1xf32>) -> tensor<4x6x10xf32>
  %xc = mapp.sub %x, %meanb : tensor<4x6x10xf32>
  %sq = mapp.mul %xc, %xc : (tensor<4x6x10xf32>, tensor<4x6x10xf32>) -> tensor<4x6x10xf32>
  %vs = mapp.reduce_sum %sq {dims = array<i64: 2>} : (tensor<4x6x10xf32>) -> tensor<4x6xf32>
  %var = mapp.scale %vs {factor = 0.1 : f64} : tensor<4x6xf32>
  %eps = mapp.fill 1.0e-5 : tensor<4x6xf32>
  %ve = mapp.add %var, %eps : (tensor<4x6xf32>, tensor<4x6xf32>) -> tensor<4x6xf32>
  %sd = mapp.sqrt %ve : tensor<4x6xf32>
  %sdk = mapp.reshape %sd : (tensor<4x6xf32>) -> tensor<4x6x1xf32>
  %sdb = mapp.broadcast %sdk : (tensor<4x6x1xf32>) -> tensor<4x6x10xf32>
  %xn = mapp.div %xc, %sdb : tensor<4x6x10xf32>
  %xw = mapp.mul %xn, %w : (tensor<4x6x10xf32>, tensor<10xf32>) -> tensor<4x6x10xf32>
  %y = mapp.add %xw, %b : (tensor<4x6x10xf32>, tensor<10xf32>) -> tensor<4x6x10xf32>
  %o = mapp.linear %y, %wo : (tensor<4x6x10xf32>, tensor<3x10xf32>) -> tensor<4x6x3xf32>
  return %o : tensor<4x6x3xf32>
}

// -----

// Softmax-like without the max (sum only): exp(x)/Σexp(x) is one region.
// The broadcast row value also read outside the region: the row value is a
// result and the broadcast stays, after the region.
// CHECK-LABEL: func.func @softmax_sum
func.func @softmax_sum(%x: tensor<3x7xf32>) -> (tensor<3x7xf32>, tensor<3x7xf32>) {
  // CHECK-NEXT: %[[F:.*]]:2 = mapp.fused %arg0 {domain = array<i64: 3, 7>, outputs = array<i64: 1, 2>, program = "exp(%i0); reduce_sum[1](%0); div(%0, %1)"} : (tensor<3x7xf32>) -> (tensor<3x1xf32>, tensor<3x7xf32>)
  // CHECK-NEXT: %[[B:.*]] = mapp.broadcast %[[F]]#0
  // CHECK-NEXT: return %[[F]]#1, %[[B]]
  %e = mapp.exp %x : tensor<3x7xf32>
  %s = mapp.reduce_sum %e {dims = array<i64: 1>} : (tensor<3x7xf32>) -> tensor<3xf32>
  %sk = mapp.reshape %s : (tensor<3xf32>) -> tensor<3x1xf32>
  %sb = mapp.broadcast %sk : (tensor<3x1xf32>) -> tensor<3x7xf32>
  %p = mapp.div %e, %sb : tensor<3x7xf32>
  return %p, %sb : tensor<3x7xf32>, tensor<3x7xf32>
}

// -----

// A sum over the leading dims still ends its region (a bias gradient):
// nothing after it joins.
// CHECK-LABEL: func.func @leading_sum_ends
func.func @leading_sum_ends(%x: tensor<4x5xf32>) -> (tensor<5xf32>, tensor<5xf32>) {
  // CHECK-NEXT: %[[S:.*]] = mapp.fused %arg0 {domain = array<i64: 4, 5>, outputs = array<i64: 1>, program = "exp(%i0); reduce_sum[0](%0)"}
  // CHECK-NEXT: %[[N:.*]] = mapp.neg %[[S]]
  %e = mapp.exp %x : tensor<4x5xf32>
  %s = mapp.reduce_sum %e {dims = array<i64: 0>} : (tensor<4x5xf32>) -> tensor<5xf32>
  %n = mapp.neg %s : tensor<5xf32>
  return %s, %n : tensor<5xf32>, tensor<5xf32>
}

// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s
// RUN: mapp-opt %s -mapp-fuse -split-input-file | mapp-opt -split-input-file -verify-each -o /dev/null

// A reduce_max over the trailing dims joins a region like a row reduce_sum
// (issue 37, docs/fusion.md "What fuses"): a numerically stable softmax
// written from primitives (x − x.max(-1, keepdim=True), exp, / sum) and a
// cross-entropy's log-sum-exp are one region each.

// CHECK-LABEL: func.func @softmax
func.func @softmax(%x: tensor<2x8x16xf32>, %wo: tensor<4x16xf32>) -> tensor<2x8x4xf32> {
  // CHECK-NEXT: %[[F:.*]] = mapp.fused %arg0 {domain = array<i64: 2, 8, 16>, outputs = array<i64: 4>, program = "reduce_max[2](%i0); sub(%i0, %0); exp(%1); reduce_sum[2](%2); div(%2, %3)"} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  // CHECK-NEXT: %[[O:.*]] = mapp.linear %[[F]]
  // CHECK-NEXT: return %[[O]]
  %m = mapp.reduce_max %x {dims = array<i64: 2>} : (tensor<2x8x16xf32>) -> tensor<2x8xf32>
  %mk = mapp.reshape %m : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %mb = mapp.broadcast %mk : (tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %d = mapp.sub %x, %mb : tensor<2x8x16xf32>
  %e = mapp.exp %d : tensor<2x8x16xf32>
  %s = mapp.reduce_sum %e {dims = array<i64: 2>} : (tensor<2x8x16xf32>) -> tensor<2x8xf32>
  %sk = mapp.reshape %s : (tensor<2x8xf32>) -> tensor<2x8x1xf32>
  %sb = mapp.broadcast %sk : (tensor<2x8x1xf32>) -> tensor<2x8x16xf32>
  %y = mapp.div %e, %sb : tensor<2x8x16xf32>
  %o = mapp.linear %y, %wo : (tensor<2x8x16xf32>, tensor<4x16xf32>) -> tensor<2x8x4xf32>
  return %o : tensor<2x8x4xf32>
}

// -----

// Cross-entropy from primitives: per row log Σ exp(x − max) + max − x_t
// (the target as a one-hot mask: select), its row max and the per-row loss
// in one region; the mean over the rows ends a region of its own.
// CHECK-LABEL: func.func @cross_entropy
func.func @cross_entropy(%x: tensor<8x32xf32>, %onehot: tensor<8x32xf32>) -> tensor<f32> {
  // CHECK-NEXT: %[[Z:.*]] = mapp.fill
  // CHECK-NEXT: %[[L:.*]] = mapp.fused %arg0, %arg1, %[[Z]] {domain = array<i64: 8, 32>, outputs = array<i64: 8>, program = "reduce_max[1](%i0); sub(%i0, %0); exp(%1); reduce_sum[1](%2); row log(%3); row add(%4, %0); select(%i1, %i0, %i2); reduce_sum[1](%6); row sub(%5, %7)"} : (tensor<8x32xf32>, tensor<8x32xf32>, tensor<f32>) -> tensor<8xf32>
  // CHECK-NEXT: %[[S:.*]] = mapp.reduce_sum %[[L]]
  // CHECK-NEXT: %[[M:.*]] = mapp.scale %[[S]]
  // CHECK-NEXT: return %[[M]]
  %zero = mapp.fill 0.0 : tensor<f32>
  %m = mapp.reduce_max %x {dims = array<i64: 1>} : (tensor<8x32xf32>) -> tensor<8xf32>
  %mk = mapp.reshape %m : (tensor<8xf32>) -> tensor<8x1xf32>
  %mb = mapp.broadcast %mk : (tensor<8x1xf32>) -> tensor<8x32xf32>
  %d = mapp.sub %x, %mb : tensor<8x32xf32>
  %e = mapp.exp %d : tensor<8x32xf32>
  %s = mapp.reduce_sum %e {dims = array<i64: 1>} : (tensor<8x32xf32>) -> tensor<8xf32>
  %ls = mapp.log %s : tensor<8xf32>
  %lse = mapp.add %ls, %m : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %zb = mapp.broadcast %zero : (tensor<f32>) -> tensor<8x32xf32>
  %xt = mapp.select %onehot, %x, %zb : tensor<8x32xf32>
  %t = mapp.reduce_sum %xt {dims = array<i64: 1>} : (tensor<8x32xf32>) -> tensor<8xf32>
  %l = mapp.sub %lse, %t : tensor<8xf32>
  %sum = mapp.reduce_sum %l {dims = array<i64: 0>} : (tensor<8xf32>) -> tensor<f32>
  %mean = mapp.scale %sum {factor = 0.125 : f64} : tensor<f32>
  return %mean : tensor<f32>
}

// -----

// A max over other dims than the rows is not in the vocabulary: it stays
// an op, and the chain after it fuses alone.
// CHECK-LABEL: func.func @max_over_leading_dims
func.func @max_over_leading_dims(%x: tensor<8x32xf32>) -> tensor<32xf32> {
  // CHECK-NEXT: %[[M:.*]] = mapp.reduce_max %arg0
  // CHECK-NEXT: %[[F:.*]] = mapp.fused %[[M]] {{.*}}program = "exp(%i0); neg(%0)"
  // CHECK-NEXT: return %[[F]]
  %m = mapp.reduce_max %x {dims = array<i64: 0>} : (tensor<8x32xf32>) -> tensor<32xf32>
  %e = mapp.exp %m : tensor<32xf32>
  %n = mapp.neg %e : tensor<32xf32>
  return %n : tensor<32xf32>
}

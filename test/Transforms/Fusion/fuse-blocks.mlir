// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s
// RUN: mapp-opt %s -mapp-fuse -split-input-file | mapp-opt -split-input-file -verify-each -o /dev/null

// Fusion decisions of --mapp-fuse (docs/fusion.md) on the blocks of the
// model families: a GPT block (bias, GELU, residual), a LLaMA block (RMS
// norm written out with the algebra: one region, rotary pieces, SwiGLU) and the
// experts' SwiGLU of an MoE block. GEMMs never fuse; every value a GEMM
// reads is materialized.

// CHECK-LABEL: func.func @gpt_block
func.func @gpt_block(%x: tensor<2x4x8xf32>, %w1: tensor<16x8xf32>, %b1: tensor<16xf32>,
                     %w2: tensor<8x16xf32>, %b2: tensor<8xf32>) -> tensor<2x4x8xf32> {
  %h = mapp.linear %x, %w1 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  // bias + GELU: one region; the bias is a broadcast load (a suffix of the domain).
  // CHECK: %[[H:.*]] = mapp.linear
  // CHECK-NEXT: %[[A:.*]] = mapp.fused %[[H]], %{{.*}} {domain = array<i64: 2, 4, 16>, outputs = array<i64: 1>, program = "add(%i0, %i1); gelu[tanh](%0)"}
  %hb = mapp.add %h, %b1 : (tensor<2x4x16xf32>, tensor<16xf32>) -> tensor<2x4x16xf32>
  %a = mapp.gelu %hb {approximate = "tanh"} : tensor<2x4x16xf32>
  // CHECK-NEXT: %[[O:.*]] = mapp.linear %[[A]]
  %o = mapp.linear %a, %w2 : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  // bias + residual: one region.
  // CHECK-NEXT: mapp.fused %[[O]], %{{.*}}, %{{.*}} {domain = array<i64: 2, 4, 8>, outputs = array<i64: 1>, program = "add(%i0, %i1); add(%0, %i2)"}
  %ob = mapp.add %o, %b2 : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %r = mapp.add %ob, %x : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // CHECK-NOT: mapp.add
  // CHECK-NOT: mapp.gelu
  return %r : tensor<2x4x8xf32>
}

// -----

// CHECK-LABEL: func.func @llama_block
func.func @llama_block(%x: tensor<2x4x8xf32>, %g: tensor<8xf32>, %cos: tensor<4x8xf32>,
                       %sin: tensor<4x8xf32>, %wq: tensor<8x8xf32>, %wgate: tensor<16x8xf32>,
                       %wup: tensor<16x8xf32>, %wdown: tensor<8x16xf32>)
    -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>) {
  // RMS norm written out: x·x and its sum over the row, the mean/eps/rsqrt
  // per row, the normalization and the gain: one region (a row program;
  // fuse-norms.mlir has the norms' forms and backwards). The [2, 4] eps is
  // read per row through a reshape to [2, 4, 1].
  // CHECK: %[[EPS:.*]] = mapp.fill
  // CHECK-NEXT: %[[E:.*]] = mapp.reshape %[[EPS]] : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  // CHECK-NEXT: %[[N:.*]] = mapp.fused %arg0, %[[E]], %arg1 {domain = array<i64: 2, 4, 8>, outputs = array<i64: 6>, program = "mul(%i0, %i0); reduce_sum[2](%0); row scale[0.125](%1); row add(%2, %i1); row rsqrt(%3); mul(%i0, %4); mul(%5, %i2)"} : (tensor<2x4x8xf32>, tensor<2x4x1xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // CHECK-NOT: mapp.broadcast
  // CHECK-NOT: mapp.reduce_sum
  %sq = mapp.mul %x, %x : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %ss = mapp.reduce_sum %sq {dims = array<i64: 2>} : (tensor<2x4x8xf32>) -> tensor<2x4xf32>
  %ms = mapp.scale %ss {factor = 0.125} : tensor<2x4xf32>
  %eps = mapp.fill 1.0e-5 : tensor<2x4xf32>
  %ms2 = mapp.add %ms, %eps : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = mapp.rsqrt %ms2 : tensor<2x4xf32>
  %rr = mapp.reshape %r : (tensor<2x4xf32>) -> tensor<2x4x1xf32>
  %rb = mapp.broadcast %rr : (tensor<2x4x1xf32>) -> tensor<2x4x8xf32>
  %n0 = mapp.mul %x, %rb : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %n = mapp.mul %n0, %g : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  // Rotary (rotate-half): q·cos + rotate(q)·sin; the slices and the concat
  // are data movement, the products and the sum one region.
  %q = mapp.linear %n, %wq : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %q1 = mapp.slice %q {dim = 2 : i64, start = 0 : i64, end = 4 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  %q2 = mapp.slice %q {dim = 2 : i64, start = 4 : i64, end = 8 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x4xf32>
  // A single op is left as it is.
  // CHECK: mapp.neg
  %nq2 = mapp.neg %q2 : tensor<2x4x4xf32>
  %rot = mapp.concat %nq2, %q1 {dim = 2 : i64} : (tensor<2x4x4xf32>, tensor<2x4x4xf32>) -> tensor<2x4x8xf32>
  %cb = mapp.broadcast %cos : (tensor<4x8xf32>) -> tensor<2x4x8xf32>
  %sb = mapp.broadcast %sin : (tensor<4x8xf32>) -> tensor<2x4x8xf32>
  // CHECK: %[[Q:.*]] = mapp.fused %{{.*}}, %arg2, %{{.*}}, %arg3 {domain = array<i64: 2, 4, 8>, outputs = array<i64: 2>, program = "mul(%i0, %i1); mul(%i2, %i3); add(%0, %1)"}
  %qc = mapp.mul %q, %cb : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %qs = mapp.mul %rot, %sb : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %qr = mapp.add %qc, %qs : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  // SwiGLU: silu(gate)·up between the GEMMs.
  %gate = mapp.linear %n, %wgate : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %up = mapp.linear %n, %wup : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  // CHECK: %[[M:.*]] = mapp.fused %{{.*}}, %{{.*}} {domain = array<i64: 2, 4, 16>, outputs = array<i64: 1>, program = "silu(%i0); mul(%0, %i1)"}
  %s = mapp.silu %gate : tensor<2x4x16xf32>
  %m = mapp.mul %s, %up : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  // CHECK: mapp.linear %[[M]]
  %d = mapp.linear %m, %wdown : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  %out = mapp.add %d, %x : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return %out, %qr : tensor<2x4x8xf32>, tensor<2x4x8xf32>
}

// -----

// The backward of a GELU MLP: the activation gradient and the bias
// gradient's sum (a reduction over the leading dims) fuse; the sum is the
// region's second output.
// CHECK-LABEL: func.func @gelu_backward
func.func @gelu_backward(%dy: tensor<2x4x16xf32>, %h: tensor<2x4x16xf32>, %w: tensor<8x16xf32>)
    -> (tensor<2x4x8xf32>, tensor<16xf32>) {
  // CHECK: %[[F:.*]]:2 = mapp.fused %arg0, %arg1 {domain = array<i64: 2, 4, 16>, outputs = array<i64: 0, 1>, program = "gelu_grad(%i0, %i1); reduce_sum[0,1](%0)"}
  %dh = mapp.gelu_grad %dy, %h : tensor<2x4x16xf32>
  %db = mapp.reduce_sum %dh {dims = array<i64: 0, 1>} : (tensor<2x4x16xf32>) -> tensor<16xf32>
  // CHECK: mapp.linear %[[F]]#0
  %dx = mapp.linear %dh, %w : (tensor<2x4x16xf32>, tensor<8x16xf32>) -> tensor<2x4x8xf32>
  return %dx, %db : tensor<2x4x8xf32>, tensor<16xf32>
}

// -----

// An MoE block's experts (grouped GEMMs over expert-sorted rows): the
// SwiGLU between them is one region; the router's softmax and the grouped
// GEMMs are not elementwise.
// CHECK-LABEL: func.func @moe_experts
func.func @moe_experts(%x: tensor<12x4xf32>, %wg: tensor<2x4x8xf32>, %wu: tensor<2x4x8xf32>,
                       %wd: tensor<2x8x4xf32>, %counts: tensor<2xi32>) -> tensor<12x4xf32> {
  %g = mapp.moe_grouped_matmul %x, %wg, %counts : (tensor<12x4xf32>, tensor<2x4x8xf32>, tensor<2xi32>) -> tensor<12x8xf32>
  %u = mapp.moe_grouped_matmul %x, %wu, %counts : (tensor<12x4xf32>, tensor<2x4x8xf32>, tensor<2xi32>) -> tensor<12x8xf32>
  // silu written with the algebra (x·sigmoid(x)), then ·up.
  // CHECK: %[[M:.*]] = mapp.fused %{{.*}}, %{{.*}} {domain = array<i64: 12, 8>, outputs = array<i64: 2>, program = "sigmoid(%i0); mul(%0, %i0); mul(%1, %i1)"}
  %sg = mapp.sigmoid %g : tensor<12x8xf32>
  %s = mapp.mul %sg, %g : (tensor<12x8xf32>, tensor<12x8xf32>) -> tensor<12x8xf32>
  %m = mapp.mul %s, %u : (tensor<12x8xf32>, tensor<12x8xf32>) -> tensor<12x8xf32>
  // CHECK: mapp.moe_grouped_matmul %[[M]]
  %y = mapp.moe_grouped_matmul %m, %wd, %counts : (tensor<12x8xf32>, tensor<2x8x4xf32>, tensor<2xi32>) -> tensor<12x4xf32>
  return %y : tensor<12x4xf32>
}

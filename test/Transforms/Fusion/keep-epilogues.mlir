// RUN: mapp-opt %s -mapp-fuse -split-input-file | FileCheck %s
// RUN: mapp-opt %s -mapp-fuse=keep-epilogues=false -split-input-file | FileCheck %s --check-prefix=ALL

// Ops the CUDA backend runs inside a GEMM's epilogue (Fusion.cu's
// planFusions) stay out of regions: taking them would trade a free
// epilogue for a pass over memory. keep-epilogues=false fuses them.

// A linear's tanh GELU (GELU_AUX_BIAS), gated: the gate's product alone is
// no region. With keep-epilogues=false: gelu and the product, one region.
// CHECK-LABEL: func.func @linear_gelu
// CHECK: mapp.gelu
// CHECK-NOT: mapp.fused
// ALL-LABEL: func.func @linear_gelu
// ALL: mapp.fused {{.*}} program = "gelu[tanh](%i0); mul(%0, %i1)"
func.func @linear_gelu(%x: tensor<2x4x8xf32>, %w1: tensor<16x8xf32>, %w2: tensor<16x8xf32>) -> tensor<2x4x16xf32> {
  %h = mapp.linear %x, %w1 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %u = mapp.linear %x, %w2 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %a = mapp.gelu %h {approximate = "tanh"} : tensor<2x4x16xf32>
  %y = mapp.mul %a, %u : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  return %y : tensor<2x4x16xf32>
}

// -----

// The exact GELU is no cuBLASLt epilogue: fused either way.
// CHECK-LABEL: func.func @linear_gelu_exact
// CHECK: mapp.fused {{.*}} program = "gelu(%i0); mul(%0, %i1)"
func.func @linear_gelu_exact(%x: tensor<2x4x8xf32>, %w1: tensor<16x8xf32>, %w2: tensor<16x8xf32>) -> tensor<2x4x16xf32> {
  %h = mapp.linear %x, %w1 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %u = mapp.linear %x, %w2 : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %a = mapp.gelu %h : tensor<2x4x16xf32>
  %y = mapp.mul %a, %u : (tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x4x16xf32>
  return %y : tensor<2x4x16xf32>
}

// -----

// A linear's result plus the residual (the GEMM accumulates into it), then
// a scale: the add stays, the scale alone is no region.
// CHECK-LABEL: func.func @linear_residual
// CHECK: mapp.add
// CHECK-NOT: mapp.fused
// ALL-LABEL: func.func @linear_residual
// ALL: mapp.fused {{.*}} program = "add(%i0, %i1); scale[0.5](%0)"
func.func @linear_residual(%x: tensor<2x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<2x4x8xf32> {
  %o = mapp.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %r = mapp.add %o, %x : (tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %s = mapp.scale %r {factor = 0.5} : tensor<2x4x8xf32>
  return %s : tensor<2x4x8xf32>
}

// -----

// The backward of a GELU MLP: dy·W2 -> gelu_grad (DGELU on the dgrad GEMM),
// and the bias gradient, the sum of the rows of the dW1 GEMM's dy (BGRADB).
// Neither fuses: the chain between them is the epilogues'. With
// keep-epilogues=false the gelu_grad and the row sum are one region.
// CHECK-LABEL: func.func @mlp_backward
// CHECK: mapp.gelu_grad
// CHECK: mapp.reduce_sum
// CHECK-NOT: mapp.fused
// ALL-LABEL: func.func @mlp_backward
// ALL: mapp.fused {{.*}} program = "gelu_grad[tanh](%i0, %i1); reduce_sum[0,1](%0)"
func.func @mlp_backward(%dy: tensor<2x4x8xf32>, %w2: tensor<8x16xf32>, %pre: tensor<2x4x16xf32>,
                        %x: tensor<8x8xf32>) -> (tensor<16x8xf32>, tensor<16xf32>) {
  %g = mapp.matmul %dy, %w2 : (tensor<2x4x8xf32>, tensor<8x16xf32>) -> tensor<2x4x16xf32>
  %dpre = mapp.gelu_grad %g, %pre {approximate = "tanh"} : tensor<2x4x16xf32>
  %db = mapp.reduce_sum %dpre {dims = array<i64: 0, 1>} : (tensor<2x4x16xf32>) -> tensor<16xf32>
  %d2 = mapp.reshape %dpre : (tensor<2x4x16xf32>) -> tensor<8x16xf32>
  %dw = mapp.matmul %d2, %x {transpose_a} : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  return %dw, %db : tensor<16x8xf32>, tensor<16xf32>
}

// -----

// A norm's input gradient plus the residual's gradient (the norm gradient
// kernel writes the sum), then a scale: the add stays.
// CHECK-LABEL: func.func @norm_grad_residual
// CHECK: mapp.add
// CHECK-NOT: mapp.fused
// ALL-LABEL: func.func @norm_grad_residual
// ALL: mapp.fused {{.*}} program = "add(%i0, %i1); scale[2](%0)"
func.func @norm_grad_residual(%dy: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %g: tensor<16xf32>,
                              %dr: tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>) {
  %dx, %dg = mapp.rms_norm_grad %dy, %x, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  %s = mapp.add %dx, %dr : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %t = mapp.scale %s {factor = 2.0} : tensor<2x8x16xf32>
  return %t, %dg : tensor<2x8x16xf32>, tensor<16xf32>
}

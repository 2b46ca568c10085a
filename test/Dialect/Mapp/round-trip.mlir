// RUN: mapp-opt %s | mapp-opt | FileCheck %s
// RUN: mapp-opt %s -mlir-print-op-generic | mapp-opt | FileCheck %s

// CHECK-LABEL: mapp.param @wte.weight : tensor<64x16xf32>
mapp.param @"wte.weight" : tensor<64x16xf32>
// CHECK: mapp.param @ln.weight : tensor<16xf32> {init = "ones"}
mapp.param @"ln.weight" : tensor<16xf32> {init = "ones"}
mapp.param @"ln.bias" : tensor<16xf32> {init = "zeros"}
mapp.param @"fc.weight" : tensor<32x16xf32> {std = 2.0e-02 : f64}
mapp.param @"fc.bias" : tensor<32xf32> {init = "zeros"}

// CHECK-LABEL: func.func @forward
func.func @forward(%tokens: tensor<2x8xi32>, %targets: tensor<2x8xi32>) -> tensor<f32> {
  // CHECK: mapp.param_ref @wte.weight : tensor<64x16xf32>
  %wte = mapp.param_ref @"wte.weight" : tensor<64x16xf32>
  // CHECK: mapp.embedding %{{.*}}, %{{.*}} : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %x = mapp.embedding %wte, %tokens : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %g = mapp.param_ref @"ln.weight" : tensor<16xf32>
  %b = mapp.param_ref @"ln.bias" : tensor<16xf32>
  // CHECK: mapp.layer_norm %{{.*}}, %{{.*}}, %{{.*}} : (
  %h = mapp.layer_norm %x, %g, %b {eps = 1.0e-5 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  // CHECK: mapp.attention {{.*}} {causal, heads = 4 : i64, rotary, scale = 5.000000e-01 : f64}
  %a = mapp.attention %h, %h, %h {heads = 4 : i64, scale = 0.5 : f64, causal, rotary} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %r = mapp.add %x, %a {mapp.name = "layers.0.residual"} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %w = mapp.param_ref @"fc.weight" : tensor<32x16xf32>
  %fb = mapp.param_ref @"fc.bias" : tensor<32xf32>
  // CHECK: mapp.linear %{{.*}}, %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  %f = mapp.linear %r, %w, %fb : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  // CHECK: mapp.gelu %{{.*}} {approximate = "tanh"} : tensor<2x8x32xf32>
  %act = mapp.gelu %f {approximate = "tanh"} : tensor<2x8x32xf32>
  %s = mapp.silu %act : tensor<2x8x32xf32>
  %d = mapp.dropout %s {p = 1.0e-01 : f64, seed = 7 : i64} : tensor<2x8x32xf32>
  %sl = mapp.slice %d {dim = 2 : i64, start = 0 : i64, end = 16 : i64} : (tensor<2x8x32xf32>) -> tensor<2x8x16xf32>
  %cat = mapp.concat %sl, %sl {dim = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x32xf32>
  %t = mapp.transpose %cat {perm = array<i64: 1, 0, 2>} : (tensor<2x8x32xf32>) -> tensor<8x2x32xf32>
  %rs = mapp.reshape %t : (tensor<8x2x32xf32>) -> tensor<16x32xf32>
  %mm = mapp.matmul %rs, %w : (tensor<16x32xf32>, tensor<32x16xf32>) -> tensor<16x16xf32>
  %sm = mapp.softmax %mm : tensor<16x16xf32>
  %sc = mapp.scale %sm {factor = 2.0 : f64} : tensor<16x16xf32>
  %logits = mapp.linear %h, %wte : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  // CHECK: mapp.cross_entropy
  %loss = mapp.cross_entropy %logits, %targets : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: func.func @grads
func.func @grads(%dy: tensor<2x8x16xf32>, %x: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>, %dl: tensor<f32>, %logits: tensor<2x8x64xf32>) {
  %g = mapp.param_ref @"ln.weight" : tensor<16xf32>
  // CHECK: mapp.layer_norm_grad
  %dx, %dg, %db = mapp.layer_norm_grad %dy, %x, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
  %dx2, %dg2 = mapp.rms_norm_grad %dy, %x, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>) -> (tensor<2x8x16xf32>, tensor<16xf32>)
  %dq, %dk, %dv = mapp.attention_grad %dy, %x, %x, %x {heads = 2 : i64, scale = 0.25 : f64, causal} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>)
  %ge = mapp.gelu_grad %dy, %x : tensor<2x8x16xf32>
  %se = mapp.silu_grad %dy, %x : tensor<2x8x16xf32>
  %sg = mapp.softmax_grad %dy, %x : tensor<2x8x16xf32>
  %dd = mapp.dropout_grad %dy {p = 0.1 : f64, seed = 7 : i64} : tensor<2x8x16xf32>
  %emb = mapp.embedding_grad %dy, %ids {vocab = 64 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<64x16xf32>
  %ce = mapp.cross_entropy_grad %dl, %logits, %ids : (tensor<f32>, tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %rsum = mapp.reduce_sum %dy {dims = array<i64: 0, 1>} : (tensor<2x8x16xf32>) -> tensor<16xf32>
  %pad = mapp.slice_grad %dy {dim = 2 : i64, start = 16 : i64} : (tensor<2x8x16xf32>) -> tensor<2x8x48xf32>
  %z = mapp.fill 0.0 : tensor<16xf32>
  // CHECK: mapp.grad_accumulate @ln.weight, %{{.*}} : tensor<16xf32>
  mapp.grad_accumulate @"ln.weight", %dg : tensor<16xf32>
  return
}

// CHECK-LABEL: func.func @optimizer_step
func.func @optimizer_step() {
  %g = mapp.grad_ref @"ln.weight" : tensor<16xf32>
  %n = mapp.global_norm %g : tensor<16xf32> -> tensor<f32>
  // CHECK: mapp.adamw @ln.weight, %{{.*}} clip(%{{.*}} : tensor<f32>) {lr = 1.000000e-03 : f64, max_norm = 1.000000e+00 : f64} : tensor<16xf32>
  mapp.adamw @"ln.weight", %g clip(%n : tensor<f32>) {lr = 1.0e-3 : f64, max_norm = 1.0 : f64} : tensor<16xf32>
  // CHECK: mapp.sgd @ln.weight, %{{.*}} {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64} : tensor<16xf32>
  mapp.sgd @"ln.weight", %g {lr = 0.1 : f64, momentum = 0.9 : f64} : tensor<16xf32>
  return
}

// CHECK-LABEL: func.func @comm
func.func @comm(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  // CHECK: mapp.all_reduce %{{.*}} {group = "tp"} : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %a = mapp.all_reduce %x {group = "tp"} : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %g = mapp.all_gather %a {group = "dp", dim = 0 : i64} : (tensor<4x16xf32>) -> tensor<8x16xf32>
  %rs = mapp.reduce_scatter %g {ranks = array<i64: 0, 1>, dim = 0 : i64} : (tensor<8x16xf32>) -> tensor<4x16xf32>
  %t = mapp.all_to_all %rs {group = "ep", split_dim = 0 : i64, concat_dim = 1 : i64} : (tensor<4x16xf32>) -> tensor<2x32xf32>
  // CHECK: mapp.send %{{.*}} to 1 tag 3 : tensor<4x16xf32>
  mapp.send %rs to 1 tag 3 : tensor<4x16xf32>
  // CHECK: mapp.recv from 1 tag 4 : tensor<4x16xf32>
  %r = mapp.recv from 1 tag 4 : tensor<4x16xf32>
  // CHECK: mapp.stage 1 chunk 0 : tensor<4x16xf32>
  %s = mapp.stage 1 chunk 0 : tensor<4x16xf32> {
    %y = mapp.scale %r {factor = 3.0 : f64} : tensor<4x16xf32>
    mapp.yield %y : tensor<4x16xf32>
  }
  return %s : tensor<4x16xf32>
}

// CHECK: mapp.subgraph @stage0_fwd "forward" stage 0 at <rank = 0, device = "gpu", index = 0, tp = 2, dp = 1, pp = 2>
mapp.subgraph @stage0_fwd "forward" stage 0 at #mapp.placement<rank = 0, device = "gpu", index = 0, tp = 2, dp = 1, pp = 2> {
  %r = mapp.recv from 1 tag 0 : tensor<4x16xf32>
  mapp.send %r to 1 tag 1 : tensor<4x16xf32>
}

// CHECK: mapp.schedule "1f1b" {chunks = 1 : i64, microbatches = 2 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>,
mapp.schedule "1f1b" {microbatches = 2 : i64, chunks = 1 : i64, tables = [
  [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>],
  [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>]]}

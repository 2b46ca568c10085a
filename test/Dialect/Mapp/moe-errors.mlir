// RUN: mapp-opt %s -split-input-file -verify-diagnostics
// Verifier diagnostics of the MoE ops (MappMoeOps.cpp), one per check.

func.func @case0(%l: tensor<6x3xf32>) {
  // expected-error @+1 {{topk must be >= 1}}
  %p, %e = mapp.moe_router %l {topk = 0 : i64} : (tensor<6x3xf32>) -> (tensor<6x0xf32>, tensor<6x0xi32>)
  return
}

// -----

func.func @case1(%l: tensor<6x3xf32>) {
  // expected-error @+1 {{topk 4 exceeds the expert count 3}}
  %p, %e = mapp.moe_router %l {topk = 4 : i64} : (tensor<6x3xf32>) -> (tensor<6x4xf32>, tensor<6x4xi32>)
  return
}

// -----

func.func @case2(%l: tensor<6xf32>) {
  // expected-error @+1 {{logits must have rank 2}}
  %p, %e = mapp.moe_router %l {topk = 1 : i64} : (tensor<6xf32>) -> (tensor<6x1xf32>, tensor<6x1xi32>)
  return
}

// -----

func.func @case3(%l: tensor<6x3xf32>) {
  // expected-error @+1 {{probs must be [6,2], got [6,3]}}
  %p, %e = mapp.moe_router %l {topk = 2 : i64} : (tensor<6x3xf32>) -> (tensor<6x3xf32>, tensor<6x2xi32>)
  return
}

// -----

func.func @case4(%p: tensor<6x2xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{dlogits must be [N, E >= k] for probs}}
  %d = mapp.moe_router_grad %p, %p, %e : (tensor<6x2xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> tensor<5x3xf32>
  return
}

// -----

func.func @case5(%p: tensor<6x2xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{num_experts must be >= 1}}
  %s, %c = mapp.moe_assign %p, %e {num_experts = 0 : i64} : (tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<6x2xi32>, tensor<0xi32>)
  return
}

// -----

func.func @case6(%p: tensor<6x2xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{top-k 2 exceeds num_experts 1}}
  %s, %c = mapp.moe_assign %p, %e {num_experts = 1 : i64} : (tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<6x2xi32>, tensor<1xi32>)
  return
}

// -----

func.func @case7(%p: tensor<6x2xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{capacity must be >= 1 token per expert, got 0}}
  %s, %c = mapp.moe_assign %p, %e {num_experts = 3 : i64, capacity = 0 : i64} : (tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<6x2xi32>, tensor<3xi32>)
  return
}

// -----

func.func @case8(%x: tensor<6x4xf32>, %s: tensor<5x2xi32>) {
  // expected-error @+1 {{slots [5,2] must have one row per token of [6,4]}}
  %y = mapp.moe_permute %x, %s : (tensor<6x4xf32>, tensor<5x2xi32>) -> tensor<12x4xf32>
  return
}

// -----

func.func @case9(%x: tensor<6x4xf32>, %s: tensor<6x2xi32>) {
  // expected-error @+1 {{permuted rows [12,5] and token rows [6,4] must have the same width}}
  %y = mapp.moe_permute %x, %s : (tensor<6x4xf32>, tensor<6x2xi32>) -> tensor<12x5xf32>
  return
}

// -----

func.func @case10(%d: tensor<12x4xf32>, %s: tensor<6x2xi32>) {
  // expected-error @+1 {{token rows must have rank 2}}
  %y = mapp.moe_permute_grad %d, %s : (tensor<12x4xf32>, tensor<6x2xi32>) -> tensor<6x4x1xf32>
  return
}

// -----

func.func @case11(%d: tensor<12x4xf32>, %p: tensor<6x1xf32>, %s: tensor<6x2xi32>) {
  // expected-error @+1 {{probs must be [6,2], got [6,1]}}
  %y = mapp.moe_unpermute %d, %p, %s : (tensor<12x4xf32>, tensor<6x1xf32>, tensor<6x2xi32>) -> tensor<6x4xf32>
  return
}

// -----

func.func @case12(%o: tensor<6x4xf32>, %d: tensor<12x4xf32>, %p: tensor<6x2xf32>, %s: tensor<6x2xi32>) {
  // expected-error @+1 {{dprobs must be [6,2], got [6,1]}}
  %a, %b = mapp.moe_unpermute_grad %o, %d, %p, %s : (tensor<6x4xf32>, tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32>) -> (tensor<12x4xf32>, tensor<6x1xf32>)
  return
}

// -----

func.func @case13(%x: tensor<12x4xf32>, %w: tensor<3x4x8xf32>, %c: tensor<2xi32>) {
  // expected-error @+1 {{counts [2] must have one entry per expert of w [3,4,8]}}
  %y = mapp.moe_grouped_matmul %x, %w, %c : (tensor<12x4xf32>, tensor<3x4x8xf32>, tensor<2xi32>) -> tensor<12x8xf32>
  return
}

// -----

func.func @case14(%x: tensor<12x4xf32>, %w: tensor<3x4x8xf32>, %c: tensor<3xi32>) {
  // expected-error @+1 {{w [3,4,8] does not take rows of x [12,4] (w is [E, N, K])}}
  %y = mapp.moe_grouped_matmul %x, %w, %c {transpose_b} : (tensor<12x4xf32>, tensor<3x4x8xf32>, tensor<3xi32>) -> tensor<12x4xf32>
  return
}

// -----

func.func @case15(%x: tensor<12x4xf32>, %w: tensor<3x4x8xf32>, %c: tensor<3xi32>) {
  // expected-error @+1 {{result must be [12,8], got [12,7]}}
  %y = mapp.moe_grouped_matmul %x, %w, %c : (tensor<12x4xf32>, tensor<3x4x8xf32>, tensor<3xi32>) -> tensor<12x7xf32>
  return
}

// -----

func.func @case16(%x: tensor<12x4xf32>, %d: tensor<11x8xf32>, %c: tensor<3xi32>) {
  // expected-error @+1 {{x [12,4] and dy [11,8] must have the same rows}}
  %y = mapp.moe_grouped_matmul_wgrad %x, %d, %c : (tensor<12x4xf32>, tensor<11x8xf32>, tensor<3xi32>) -> tensor<3x4x8xf32>
  return
}

// -----

func.func @case17(%l: tensor<6x3xf32>, %e: tensor<6x4xi32>) {
  // expected-error @+1 {{experts must be [N, k <= E] for logits [6,3], got [6,4]}}
  %a = mapp.moe_aux_loss %l, %e {coeff = 0.01 : f64} : (tensor<6x3xf32>, tensor<6x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @case18(%l: tensor<6x3xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{'mapp.moe_aux_loss' op coeff must be finite and >= 0, got -1}}
  %a = mapp.moe_aux_loss %l, %e {coeff = -1.0 : f64} : (tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<f32>
  return
}

// -----

func.func @case19(%d: tensor<f32>, %l: tensor<6x3xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{'mapp.moe_aux_loss_grad' op coeff must be finite and >= 0}}
  %a = mapp.moe_aux_loss_grad %d, %l, %e {coeff = -1.0 : f64} : (tensor<f32>, tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @case20(%l: tensor<6x3xf32>) {
  // expected-error @+1 {{'mapp.moe_z_loss' op coeff must be finite and >= 0}}
  %a = mapp.moe_z_loss %l {coeff = -1.0 : f64} : (tensor<6x3xf32>) -> tensor<f32>
  return
}

// -----

func.func @case21(%d: tensor<f32>, %l: tensor<6x3xf32>) {
  // expected-error @+1 {{'mapp.moe_z_loss_grad' op coeff must be finite and >= 0}}
  %a = mapp.moe_z_loss_grad %d, %l {coeff = -1.0 : f64} : (tensor<f32>, tensor<6x3xf32>) -> tensor<6x3xf32>
  return
}

// -----

func.func @case22(%d: tensor<f32>, %l: tensor<6x3xf32>) {
  // expected-error @+1 {{dlogits must be [6,3], got [6,2]}}
  %a = mapp.moe_z_loss_grad %d, %l {coeff = 1.0 : f64} : (tensor<f32>, tensor<6x3xf32>) -> tensor<6x2xf32>
  return
}

// -----

func.func @case23(%d: tensor<f32>, %l: tensor<6x3xf32>, %e: tensor<6x2xi32>) {
  // expected-error @+1 {{'mapp.moe_aux_loss_grad' op dlogits must be [6,3]}}
  %a = mapp.moe_aux_loss_grad %d, %l, %e {coeff = 1.0 : f64} : (tensor<f32>, tensor<6x3xf32>, tensor<6x2xi32>) -> tensor<6x2xf32>
  return
}

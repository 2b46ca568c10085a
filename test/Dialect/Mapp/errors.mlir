// RUN: mapp-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{init must be "normal", "ones", "zeros" or "fp8_meta", got "xavier"}}
mapp.param @w : tensor<4x4xf32> {init = "xavier"}

// -----

func.func @unknown_param() {
  // expected-error @+1 {{refers to unknown parameter @nope}}
  %0 = mapp.param_ref @nope : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4x4xf32>
func.func @param_type_mismatch() {
  // expected-error @+1 {{does not match parameter @w of type 'tensor<4x4xf32>'}}
  %0 = mapp.param_ref @w : tensor<4x8xf32>
  return
}

// -----

func.func @linear_in_features(%x: tensor<2x8xf32>, %w: tensor<4x16xf32>) {
  // expected-error @+1 {{x's last dim must equal weight's in-features 16}}
  %0 = mapp.linear %x, %w : (tensor<2x8xf32>, tensor<4x16xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<2x8xf32>, %w: tensor<4x8xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{bias must be [4], got [8]}}
  %0 = mapp.linear %x, %w, %b : (tensor<2x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @linear_mixed_types(%x: tensor<2x8xbf16>, %w: tensor<4x8xf32>) {
  // expected-error @+1 {{expects one element type}}
  %0 = mapp.linear %x, %w : (tensor<2x8xbf16>, tensor<4x8xf32>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @matmul_contraction(%a: tensor<2x3xf32>, %b: tensor<4x5xf32>) {
  // expected-error @+1 {{contraction dims differ: 3 vs 4}}
  %0 = mapp.matmul %a, %b : (tensor<2x3xf32>, tensor<4x5xf32>) -> tensor<2x5xf32>
  return
}

// -----

func.func @matmul_batch(%a: tensor<2x3x4xf32>, %b: tensor<3x4x5xf32>) {
  // expected-error @+1 {{batch dims differ: [2] vs [3]}}
  %0 = mapp.matmul %a, %b : (tensor<2x3x4xf32>, tensor<3x4x5xf32>) -> tensor<2x3x5xf32>
  return
}

// -----

func.func @heads_divide(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{heads (3) must be > 0 and divide hidden (16)}}
  %0 = mapp.attention %q, %q, %q {heads = 3 : i64, scale = 1.0 : f64, causal} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @rotary_odd(%q: tensor<2x8x12xf32>) {
  // expected-error @+1 {{rotary needs an even head dim, got 3}}
  %0 = mapp.attention %q, %q, %q {heads = 4 : i64, scale = 1.0 : f64, rotary} : (tensor<2x8x12xf32>, tensor<2x8x12xf32>, tensor<2x8x12xf32>) -> tensor<2x8x12xf32>
  return
}

// -----

func.func @ln_gamma(%x: tensor<2x8xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{gamma must be [8] to match the last dim of x, got [4]}}
  %0 = mapp.layer_norm %x, %g, %g : (tensor<2x8xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @ln_eps(%x: tensor<2x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{eps must be > 0}}
  %0 = mapp.rms_norm %x, %g {eps = 0.0 : f64} : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @broadcast(%a: tensor<2x8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{rhs shape [4] must be a suffix of lhs shape [2,8]}}
  %0 = mapp.add %a, %b : (tensor<2x8xf32>, tensor<4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @gelu_mode(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{approximate must be "none" or "tanh", got "fast"}}
  %0 = mapp.gelu %a {approximate = "fast"} : tensor<2x8xf32>
  return
}

// -----

func.func @dropout_p(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{p must be in [0, 1), got 1.5}}
  %0 = mapp.dropout %a {p = 1.5 : f64, seed = 1 : i64} : tensor<2x8xf32>
  return
}

// -----

func.func @embedding_shape(%t: tensor<64x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{result must be [2,8,16] (ids shape + hidden), got [2,8,8]}}
  %0 = mapp.embedding %t, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x8xf32>
  return
}

// -----

func.func @ce_shape(%l: tensor<2x8x64xf32>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{logits must be targets shape + [vocab]}}
  %0 = mapp.cross_entropy %l, %t : (tensor<2x8x64xf32>, tensor<2x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @reshape_count(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{element count changes from 16 to 15}}
  %0 = mapp.reshape %a : (tensor<2x8xf32>) -> tensor<3x5xf32>
  return
}

// -----

func.func @perm(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{perm must be a permutation of 0..1}}
  %0 = mapp.transpose %a {perm = array<i64: 0, 0>} : (tensor<2x8xf32>) -> tensor<2x2xf32>
  return
}

// -----

func.func @slice_range(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{range [4, 12) is empty or outside [0, 8)}}
  %0 = mapp.slice %a {dim = 1 : i64, start = 4 : i64, end = 12 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @concat_mismatch(%a: tensor<2x8xf32>, %b: tensor<3x8xf32>) {
  // expected-error @+1 {{inputs differ outside dim 1}}
  %0 = mapp.concat %a, %b {dim = 1 : i64} : (tensor<2x8xf32>, tensor<3x8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @reduce_dims(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{dims must be sorted and unique}}
  %0 = mapp.reduce_sum %a {dims = array<i64: 1, 0>} : (tensor<2x8xf32>) -> tensor<f32>
  return
}

// -----

func.func @group_name(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{group must be tp, dp, pp, ep or edp, got "xp"}}
  %0 = mapp.all_reduce %a {group = "xp"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @group_both(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{needs exactly one of `group` or `ranks`}}
  %0 = mapp.all_reduce %a {group = "tp", ranks = array<i64: 0, 1>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @gather_ranks(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{gathered dim must be shard dim × number of ranks}}
  %0 = mapp.all_gather %a {ranks = array<i64: 0, 1, 2>, dim = 0 : i64} : (tensor<2x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @send_peer(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{peer and tag must be >= 0}}
  mapp.send %a to -1 tag 0 : tensor<2x8xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_betas(%g: tensor<4xf32>) {
  // expected-error @+1 {{betas must be in [0, 1)}}
  mapp.adamw @w, %g {lr = 1.0e-3 : f64, beta1 = 1.0 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @cosine_total(%g: tensor<4xf32>) {
  // expected-error @+1 {{cosine schedule needs total_steps (10) > warmup (10)}}
  mapp.sgd @w, %g {lr = 1.0e-3 : f64, schedule = "cosine", warmup = 10 : i64, total_steps = 10 : i64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @clip_without_norm(%g: tensor<4xf32>) {
  // expected-error @+1 {{a clip operand and max_norm > 0 go together}}
  mapp.sgd @w, %g {lr = 1.0e-3 : f64, max_norm = 1.0 : f64} : tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{placement device must be "cpu" or "gpu", got "tpu"}}
mapp.subgraph @s "forward" stage 0 at #mapp.placement<rank = 0, device = "tpu", index = 0, tp = 1, dp = 1, pp = 1> {
}

// -----

// expected-error @+1 {{phase must be "forward" or "backward", got "sideways"}}
mapp.subgraph @s "sideways" stage 0 at #mapp.placement<rank = 0, device = "cpu", index = 0, tp = 1, dp = 1, pp = 1> {
}

// -----

// expected-error @+1 {{rank 0: task #mapp.task<F, 0, 0> appears more than once}}
mapp.schedule "gpipe" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 0, 0>, #mapp.task<F, 0, 0>]]}

// -----

// expected-error @+1 {{rank 1 has 1 tasks, expected 2}}
mapp.schedule "gpipe" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>], [#mapp.task<F, 0, 0>]]}

// -----

// expected-error @+1 {{rank 0: task #mapp.task<F, 1, 0> is outside 1 chunk(s) × 1 microbatch(es)}}
mapp.schedule "gpipe" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 1, 0>, #mapp.task<B, 0, 0>]]}

// -----

func.func @stage_yield(%a: tensor<2xf32>) {
  // expected-error @+1 {{yielded types must match the stage's result types}}
  %0 = mapp.stage 0 chunk 0 : tensor<4xf32> {
    mapp.yield %a : tensor<2xf32>
  }
  return
}

// -----

func.func @trace_category() {
  // expected-error @+1 {{category must be compute, comm, memcpy, data or optimizer, got "gpu"}}
  mapp.trace_begin 0 "x" "gpu"
  mapp.trace_end 0
  return
}

// RUN: mapp-opt %s -split-input-file -verify-diagnostics
// Verifier diagnostics not covered by errors.mlir: one case per emitOpError
// site of lib/Dialect/Mapp/IR (test/python/test_verifier_coverage.py checks
// that every site has one).

// expected-error @+1 {{parameter name must not be empty}}
mapp.param @"" : tensor<4xf32>

// -----

// expected-error @+1 {{std must be >= 0}}
mapp.param @w : tensor<4xf32> {std = -1.0 : f64}

// -----

// expected-error @+1 {{parameter shape must be static}}
mapp.param @w : tensor<?x4xf32>

// -----

func.func @global_norm_empty() {
  // expected-error @+1 {{needs at least one gradient}}
  %n = "mapp.global_norm"() : () -> tensor<f32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_lr(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.adamw' op lr must be >= 0 and finite, got -1}}
  mapp.adamw @w, %g {lr = -1.0 : f64} : tensor<4xf32>
  return
}

// -----

// Issue 43: lr = inf was accepted (and trained to NaN).
mapp.param @w : tensor<4xf32>
func.func @sgd_lr_inf(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.sgd' op lr must be >= 0 and finite, got inf}}
  mapp.sgd @w, %g {lr = 0x7FF0000000000000 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_min_lr(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.adamw' op min_lr must be in [0, lr], got 0.5}}
  mapp.adamw @w, %g {lr = 0.1 : f64, min_lr = 0.5 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_beta_nan(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.adamw' op betas must be in [0, 1)}}
  mapp.adamw @w, %g {lr = 0.1 : f64, beta1 = 0x7FF8000000000000 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @sgd_schedule(%g: tensor<4xf32>) {
  // expected-error @+1 {{schedule must be "constant" or "cosine", got "linear"}}
  mapp.sgd @w, %g {lr = 0.1 : f64, schedule = "linear"} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @sgd_warmup(%g: tensor<4xf32>) {
  // expected-error @+1 {{warmup and total_steps must be >= 0}}
  mapp.sgd @w, %g {lr = 0.1 : f64, warmup = -1 : i64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @sgd_max_norm(%g: tensor<4xf32>) {
  // expected-error @+1 {{max_norm must be >= 0 and finite, got -1}}
  mapp.sgd @w, %g {lr = 0.1 : f64, max_norm = -1.0 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_eps(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.adamw' op eps must be > 0 and finite}}
  mapp.adamw @w, %g {lr = 1.0e-3 : f64, eps = 0.0 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @adamw_weight_decay(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.adamw' op weight_decay must be >= 0 and finite}}
  mapp.adamw @w, %g {lr = 1.0e-3 : f64, weight_decay = -0.1 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @sgd_momentum(%g: tensor<4xf32>) {
  // expected-error @+1 {{momentum must be >= 0 and finite}}
  mapp.sgd @w, %g {lr = 0.1 : f64, momentum = -0.5 : f64} : tensor<4xf32>
  return
}

// -----

mapp.param @w : tensor<4xf32>
func.func @sgd_weight_decay(%g: tensor<4xf32>) {
  // expected-error @+1 {{'mapp.sgd' op weight_decay must be >= 0 and finite}}
  mapp.sgd @w, %g {lr = 0.1 : f64, weight_decay = 0x7FF0000000000000 : f64} : tensor<4xf32>
  return
}

// -----

func.func @embedding_table(%t: tensor<64xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{table must be [vocab, hidden], got [64]}}
  %0 = mapp.embedding %t, %ids : (tensor<64xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @embedding_grad_dy(%dy: tensor<2x4x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{dy must be ids shape + [hidden], got [2,4,16] for ids [2,8]}}
  %0 = mapp.embedding_grad %dy, %ids {vocab = 64 : i64} : (tensor<2x4x16xf32>, tensor<2x8xi32>) -> tensor<64x16xf32>
  return
}

// -----

func.func @embedding_grad_vocab(%dy: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{vocab must be > 0}}
  %0 = mapp.embedding_grad %dy, %ids {vocab = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<0x16xf32>
  return
}

// -----

func.func @embedding_grad_result(%dy: tensor<2x8x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{result must be [vocab, hidden] = [64,16], got [32,16]}}
  %0 = mapp.embedding_grad %dy, %ids {vocab = 64 : i64} : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<32x16xf32>
  return
}

// -----

func.func @linear_weight_rank(%x: tensor<2x8xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{weight must be [out, in], got [8]}}
  %0 = mapp.linear %x, %w : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @linear_result(%x: tensor<2x8xf32>, %w: tensor<4x8xf32>) {
  // expected-error @+1 {{'mapp.linear' op result must be [2,4], got [2,8]}}
  %0 = mapp.linear %x, %w : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @matmul_rank(%a: tensor<8xf32>, %b: tensor<8x4xf32>) {
  // expected-error @+1 {{operands must have rank >= 2}}
  %0 = mapp.matmul %a, %b : (tensor<8xf32>, tensor<8x4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @matmul_b_rank(%a: tensor<2x3x4x5xf32>, %b: tensor<3x5x6xf32>) {
  // expected-error @+1 {{b must be 2-d or batched like a (rank 4), got rank 3}}
  %0 = mapp.matmul %a, %b : (tensor<2x3x4x5xf32>, tensor<3x5x6xf32>) -> tensor<2x3x4x6xf32>
  return
}

// -----

func.func @matmul_result(%a: tensor<2x3xf32>, %b: tensor<3x5xf32>) {
  // expected-error @+1 {{'mapp.matmul' op result must be [2,5], got [5,2]}}
  %0 = mapp.matmul %a, %b : (tensor<2x3xf32>, tensor<3x5xf32>) -> tensor<5x2xf32>
  return
}

// -----

func.func @reduce_dim_range(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.reduce_sum' op dim 2 out of range for rank 2}}
  %0 = mapp.reduce_sum %a {dims = array<i64: 2>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @reduce_result(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.reduce_sum' op result must be [8], got [2]}}
  %0 = mapp.reduce_sum %a {dims = array<i64: 0>} : (tensor<2x8xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @broadcast_result(%a: tensor<2x8xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{result type must equal lhs type 'tensor<2x8xf32>'}}
  %0 = mapp.mul %a, %b : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @ln_eps(%x: tensor<2x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{'mapp.layer_norm' op eps must be > 0}}
  %0 = mapp.layer_norm %x, %g, %g {eps = -1.0 : f64} : (tensor<2x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @ln_result(%x: tensor<2x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{'mapp.layer_norm' op result type must equal x's type}}
  %0 = mapp.layer_norm %x, %g, %g : (tensor<2x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<16xf32>
  return
}

// -----

func.func @rms_result(%x: tensor<2x8xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{'mapp.rms_norm' op result type must equal x's type}}
  %0 = mapp.rms_norm %x, %g : (tensor<2x8xf32>, tensor<8xf32>) -> tensor<2x8xbf16>
  return
}

// -----

func.func @attention_rank(%q: tensor<8x16xf32>) {
  // expected-error @+1 {{q must be [batch, seq, hidden], got [8,16]}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64} : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

func.func @attention_types(%q: tensor<2x8x16xf32>, %k: tensor<2x4x16xf32>) {
  // expected-error @+1 {{k and v must be one type [batch, seq, kv_hidden] and the result q's type}}
  %0 = mapp.attention %q, %k, %k {heads = 2 : i64, scale = 1.0 : f64} : (tensor<2x8x16xf32>, tensor<2x4x16xf32>, tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @attention_kv_heads(%q: tensor<2x8x16xf32>, %k: tensor<2x8x12xf32>) {
  // expected-error @+1 {{k/v width 12 must be a number of key/value heads of 4 columns dividing heads (4)}}
  %0 = mapp.attention %q, %k, %k {heads = 4 : i64, scale = 1.0 : f64} : (tensor<2x8x16xf32>, tensor<2x8x12xf32>, tensor<2x8x12xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @attention_kv_width(%q: tensor<2x8x16xf32>, %k: tensor<2x8x6xf32>) {
  // expected-error @+1 {{k/v width 6 must be a number of key/value heads of 4 columns dividing heads (4)}}
  %0 = mapp.attention %q, %k, %k {heads = 4 : i64, scale = 1.0 : f64} : (tensor<2x8x16xf32>, tensor<2x8x6xf32>, tensor<2x8x6xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @attention_scale(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{scale must be > 0}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 0.0 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @reshape_type(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{cannot change the element type}}
  %0 = mapp.reshape %a : (tensor<2x8xf32>) -> tensor<16xbf16>
  return
}

// -----

func.func @perm_size(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{perm has 3 entries for rank 2}}
  %0 = mapp.transpose %a {perm = array<i64: 0, 1, 2>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @transpose_result(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.transpose' op result must be [8,2], got [2,8]}}
  %0 = mapp.transpose %a {perm = array<i64: 1, 0>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @slice_dim(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.slice' op dim 2 out of range for rank 2}}
  %0 = mapp.slice %a {dim = 2 : i64, start = 0 : i64, end = 1 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @slice_shape(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{slice shape must be [2,4], got [2,3]}}
  %0 = mapp.slice %a {dim = 1 : i64, start = 0 : i64, end = 4 : i64} : (tensor<2x8xf32>) -> tensor<2x3xf32>
  return
}

// -----

func.func @slice_grad_dim(%dy: tensor<2x4xf32>) {
  // expected-error @+1 {{'mapp.slice_grad' op dim -1 out of range for rank 2}}
  %0 = mapp.slice_grad %dy {dim = -1 : i64, start = 0 : i64} : (tensor<2x4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @concat_empty() {
  // expected-error @+1 {{needs at least one input}}
  %0 = "mapp.concat"() {dim = 0 : i64} : () -> tensor<2xf32>
  return
}

// -----

func.func @concat_dim(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.concat' op dim 2 out of range for rank 2}}
  %0 = mapp.concat %a, %a {dim = 2 : i64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @concat_rank(%a: tensor<2x8xf32>, %b: tensor<2x8x1xf32>) {
  // expected-error @+1 {{inputs must share one rank}}
  %0 = mapp.concat %a, %b {dim = 0 : i64} : (tensor<2x8xf32>, tensor<2x8x1xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @concat_result(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.concat' op result must be [4,8], got [2,16]}}
  %0 = mapp.concat %a, %a {dim = 0 : i64} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @group_ranks_empty(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{ranks must not be empty}}
  %0 = mapp.all_reduce %a {ranks = array<i64>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @group_ranks_distinct(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{ranks must be distinct and >= 0}}
  %0 = mapp.all_reduce %a {ranks = array<i64: 0, 0>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @gather_dim(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{dim 2 out of range or ranks differ}}
  %0 = mapp.all_gather %a {group = "tp", dim = 2 : i64} : (tensor<2x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @gather_other_dims(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{shapes may differ only along dim 0}}
  %0 = mapp.all_gather %a {group = "tp", dim = 0 : i64} : (tensor<2x8xf32>) -> tensor<4x4xf32>
  return
}

// -----

func.func @scatter_multiple(%a: tensor<6x8xf32>) {
  // expected-error @+1 {{gathered dim 6 must be a multiple of the shard dim 4}}
  %0 = mapp.reduce_scatter %a {group = "tp", dim = 0 : i64} : (tensor<6x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @all_reduce_kind(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{reduction must be sum, max or avg, got "min"}}
  %0 = mapp.all_reduce %a {group = "tp", reduction = "min"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @all_to_all_dims(%a: tensor<4x16xf32>) {
  // expected-error @+1 {{split_dim and concat_dim must be in [0, 2)}}
  %0 = mapp.all_to_all %a {group = "ep", split_dim = 2 : i64, concat_dim = 0 : i64} : (tensor<4x16xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @all_to_all_count(%a: tensor<4x16xf32>) {
  // expected-error @+1 {{all_to_all must keep the element count}}
  %0 = mapp.all_to_all %a {group = "ep", split_dim = 0 : i64, concat_dim = 1 : i64} : (tensor<4x16xf32>) -> tensor<2x16xf32>
  return
}

// -----

func.func @recv_tag() {
  // expected-error @+1 {{'mapp.recv' op peer and tag must be >= 0}}
  %0 = mapp.recv from 0 tag -1 : tensor<4xf32>
  return
}

// -----

func.func @stage_negative(%a: tensor<2xf32>) {
  // expected-error @+1 {{stage and chunk must be >= 0}}
  %0 = mapp.stage -1 chunk 0 : tensor<2xf32> {
    mapp.yield %a : tensor<2xf32>
  }
  return
}

// -----

// expected-error @+1 {{'mapp.subgraph' op stage must be >= 0}}
mapp.subgraph @s "forward" stage -1 at #mapp.placement<rank = 0, device = "cpu", index = 0, tp = 1, dp = 1, pp = 1> {
}

// -----

// expected-error @+1 {{placement rank and device index must be >= 0}}
mapp.subgraph @s "forward" stage 0 at #mapp.placement<rank = -1, device = "cpu", index = 0, tp = 1, dp = 1, pp = 1> {
}

// -----

// expected-error @+1 {{placement parallel degrees must be >= 1}}
mapp.subgraph @s "forward" stage 0 at #mapp.placement<rank = 0, device = "cpu", index = 0, tp = 0, dp = 1, pp = 1> {
}

// -----

// expected-error @+1 {{microbatches and chunks must be > 0}}
mapp.schedule "gpipe" {microbatches = 0 : i64, chunks = 1 : i64, tables = []}


// -----

// expected-error @+1 {{rank 0: entry 3 : i64 is not a #mapp.task}}
mapp.schedule "gpipe" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[3]]}

// -----

// expected-error @+1 {{rank 0 mixes fused and split backward tasks}}
mapp.schedule "zb" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<Bi, 0, 0>]]}

// -----

// expected-error @+1 {{(every chunk × microbatch, forward and backward, exactly once)}}
mapp.schedule "gpipe" {microbatches = 2 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>]]}

// -----

func.func @trace_id() {
  // expected-error @+1 {{id and bytes must be >= 0}}
  mapp.trace_begin -1 "x" "compute"
  mapp.trace_end 0
  return
}

// -----

// expected-error @+1 {{shard_group needs shard_dim}}
mapp.param @a : tensor<4x4xf32> {shard_group = "tp"}

// -----

// expected-error @+1 {{shard_blocks needs shard_dim}}
mapp.param @a : tensor<4x4xf32> {shard_blocks = 2 : i64}

// -----

func.func @reduce_max_dim(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.reduce_max' op dim 2 out of range for rank 2}}
  %0 = mapp.reduce_max %a {dims = array<i64: 2>} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @reduce_max_sorted(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.reduce_max' op dims must be sorted and unique}}
  %0 = mapp.reduce_max %a {dims = array<i64: 1, 1>} : (tensor<2x8xf32>) -> tensor<2xf32>
  return
}

// -----

func.func @reduce_max_result(%a: tensor<2x8xf32>) {
  // expected-error @+1 {{'mapp.reduce_max' op result must be [2], got [8]}}
  %0 = mapp.reduce_max %a {dims = array<i64: 1>} : (tensor<2x8xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @vocab_ce_logits(%l: tensor<2x8xf32>, %t: tensor<2x4xi32>, %m: tensor<2x4xf32>) {
  // expected-error @+1 {{logits must be targets shape + [vocab shard], got [2,8] for targets [2,4]}}
  %p = mapp.vocab_ce_partials %l, %t, %m {group = "tp"} : (tensor<2x8xf32>, tensor<2x4xi32>, tensor<2x4xf32>) -> tensor<2x4x2xf32>
  return
}

// -----

func.func @vocab_ce_rowmax(%l: tensor<2x4x8xf32>, %t: tensor<2x4xi32>, %m: tensor<2xf32>) {
  // expected-error @+1 {{rowmax must have the targets' shape [2,4]}}
  %p = mapp.vocab_ce_partials %l, %t, %m {group = "tp"} : (tensor<2x4x8xf32>, tensor<2x4xi32>, tensor<2xf32>) -> tensor<2x4x2xf32>
  return
}

// -----

func.func @ce_from_partials(%p: tensor<2x4x3xf32>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{partials must be targets shape + [2], got [2,4,3] for targets [2,4]}}
  %l = mapp.ce_from_partials %p, %t : (tensor<2x4x3xf32>, tensor<2x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @scatter_dim(%x: tensor<2x4x8xf32>) {
  // expected-error @+1 {{'mapp.scatter_to_group' op dim 3 out of range or ranks differ}}
  %s = mapp.scatter_to_group %x {group = "tp", dim = 3 : i64} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @scatter_other_dims(%x: tensor<2x4x8xf32>) {
  // expected-error @+1 {{'mapp.scatter_to_group' op shapes may differ only along dim 1}}
  %s = mapp.scatter_to_group %x {group = "tp", dim = 1 : i64} : (tensor<2x4x8xf32>) -> tensor<2x2x4xf32>
  return
}

// -----

mapp.param @a : tensor<4xf32>
func.func @grad_sync_group() {
  // expected-error @+1 {{'mapp.grad_sync' op needs exactly one of `group` or `ranks`}}
  mapp.grad_sync [@a] {bucket = 0 : i64}
  return
}

// -----

mapp.param @a : tensor<4xf32>
func.func @grad_sync_reduction() {
  // expected-error @+1 {{reduction must be sum or avg, got "max"}}
  mapp.grad_sync [@a] {group = "dp", bucket = 0 : i64, reduction = "max"}
  return
}

// -----

func.func @grad_sync_empty() {
  // expected-error @+1 {{needs at least one parameter}}
  mapp.grad_sync [] {group = "dp", bucket = 0 : i64}
  return
}

// -----

func.func @probe_no_input() {
  // expected-error @+1 {{takes one input (two for 'attn', 3-4 for 'lens'), got 0}}
  "mapp.probe"() {probe_id = 0 : i64, point = "x", reduce = "max"} : () -> ()
  return
}

// -----

func.func @probe_no_reduction(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{needs at least one reduction}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = ","} : tensor<2x4xf32>
  return
}

// -----

func.func @probe_unknown(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'mapp.probe' op unknown reduction 'p99' (expected max, min, mean, std, absmax, sparsity, hist, topk, sketch, raw, attn or lens)}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "p99"} : tensor<2x4xf32>
  return
}

// -----

func.func @probe_lens_operands(%x: tensor<1x3x4xf32>, %g: tensor<4xf32>, %b: tensor<4xf32>, %w: tensor<7x4xf32>) {
  // expected-error @+1 {{'mapp.probe' op 'lens' is the only reduction of a probe on x [B,T,H], the final norm's weights and the unembedding}}
  mapp.probe %x, %g, %b, %w {probe_id = 0 : i64, point = "x", reduce = "lens,max", k = 2 : i64} : tensor<1x3x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @probe_lens_unembedding(%x: tensor<1x3x4xf32>, %g: tensor<4xf32>, %b: tensor<4xf32>, %w: tensor<7x5xf32>) {
  // expected-error @+1 {{'mapp.probe' op 'lens' unembedding must be [vocab, H]}}
  mapp.probe %x, %g, %b, %w {probe_id = 0 : i64, point = "x", reduce = "lens", k = 2 : i64} : tensor<1x3x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<7x5xf32>
  return
}

// -----

func.func @probe_lens_k(%x: tensor<1x3x4xf32>, %g: tensor<4xf32>, %b: tensor<4xf32>, %w: tensor<7x4xf32>) {
  // expected-error @+1 {{'mapp.probe' op 'lens' needs k >= 1}}
  mapp.probe %x, %g, %b, %w {probe_id = 0 : i64, point = "x", reduce = "lens", k = 0 : i64} : tensor<1x3x4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @probe_two_inputs(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{takes one input unless it records 'attn'}}
  mapp.probe %x, %x {probe_id = 0 : i64, point = "x", reduce = "max"} : tensor<2x4xf32>, tensor<2x4xf32>
  return
}

// -----

func.func @probe_topk(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'topk' needs k >= 1}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "topk", k = 0 : i64} : tensor<2x4xf32>
  return
}

// -----

func.func @probe_sketch(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'sketch' needs dim >= 1}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "sketch"} : tensor<2x4xf32>
  return
}

// -----

func.func @probe_raw(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'raw' needs cap >= 1}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "raw", cap = 0 : i64} : tensor<2x4xf32>
  return
}

// -----

func.func @probe_attn_types(%q: tensor<1x4x8xf32>, %k: tensor<1x2x8xf32>) {
  // expected-error @+1 {{'attn' needs q and k of one [B,T,H] type}}
  mapp.probe %q, %k {probe_id = 0 : i64, point = "p", reduce = "attn", heads = 2 : i64} : tensor<1x4x8xf32>, tensor<1x2x8xf32>
  return
}

// -----

func.func @probe_attn_heads(%q: tensor<1x4x8xf32>) {
  // expected-error @+1 {{'attn' needs heads dividing H}}
  mapp.probe %q, %q {probe_id = 0 : i64, point = "p", reduce = "attn", heads = 3 : i64} : tensor<1x4x8xf32>, tensor<1x4x8xf32>
  return
}

// -----

func.func @perturb_unknown(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'mapp.perturb' op unknown perturbation kind 'zero' (expected gaussian, uniform, offset, mask, bitflip, int8 or fp8)}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "zero", point = "x", target = "compute"} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @perturb_p(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{p must be in [0, 1], got 2}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "bitflip", point = "x", target = "storage", p = 2.0 : f64} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @perturb_mask_channels(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'mask' needs channels}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "mask", point = "x", target = "compute"} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @perturb_mask_range(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{'mapp.perturb' op mask channel -1 outside the last dim of 'tensor<2x4xf32>'}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "mask", point = "x", target = "compute", channels = array<i64: -1>} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @perturb_bf16(%x: tensor<2x4xbf16>) -> tensor<2x4xbf16> {
  // expected-error @+1 {{perturbs f32 tensors only}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "gaussian", point = "x", target = "compute"} : tensor<2x4xbf16>
  return %y : tensor<2x4xbf16>
}

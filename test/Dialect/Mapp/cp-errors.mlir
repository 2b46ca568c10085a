// RUN: mapp-opt %s -split-input-file -verify-diagnostics
// Verifier diagnostics of the context-parallel ops (MappCpOps.cpp).

func.func @shard_members(%x: tensor<2x8xi32>) {
  // expected-error @+1 {{members must be >= 1, got 0}}
  %y = mapp.cp_shard %x {dim = 1 : i64, members = 0 : i64} : (tensor<2x8xi32>) -> tensor<2x8xi32>
  return
}

// -----

func.func @shard_dim(%x: tensor<2x8xi32>) {
  // expected-error @+1 {{dim 2 is outside rank 2}}
  %y = mapp.cp_shard %x {dim = 2 : i64, members = 2 : i64} : (tensor<2x8xi32>) -> tensor<2x4xi32>
  return
}

// -----

func.func @shard_dtype(%x: tensor<2x8xi32>) {
  // expected-error @+1 {{operand and result element types differ}}
  %y = mapp.cp_shard %x {dim = 1 : i64, members = 2 : i64} : (tensor<2x8xi32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @shard_seq(%x: tensor<2x6xi32>) {
  // expected-error @+1 {{sequence length 6 along dim 1 is not divisible by 2·cp = 4 (load-balanced causal chunks)}}
  %y = mapp.cp_shard %x {dim = 1 : i64, members = 2 : i64} : (tensor<2x6xi32>) -> tensor<2x3xi32>
  return
}

// -----

func.func @unshard_share(%x: tensor<8x4xf32>) {
  // expected-error @+1 {{the share must have 4 along dim 0 and the rest alike}}
  %y = mapp.cp_unshard %x {dim = 0 : i64, members = 2 : i64} : (tensor<8x4xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @attn_rank(%q: tensor<4x8xf32>) {
  // expected-error @+1 {{q must be [batch, seq share, hidden], got rank 2}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "ring"} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @attn_kv(%q: tensor<1x4x8xf32>, %k: tensor<1x2x8xf32>) {
  // expected-error @+1 {{k and v must be one shape [batch, seq share, kv_hidden] and the result q's type}}
  %o = mapp.cp_attention %q, %k, %k {heads = 2 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "ring"} : (tensor<1x4x8xf32>, tensor<1x2x8xf32>, tensor<1x2x8xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

func.func @attn_heads(%q: tensor<1x4x8xf32>) {
  // expected-error @+1 {{heads (3) must divide hidden (8)}}
  %o = mapp.cp_attention %q, %q, %q {heads = 3 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "ring"} : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

func.func @attn_kv_width(%q: tensor<1x4x8xf32>, %k: tensor<1x4x6xf32>) {
  // expected-error @+1 {{k/v width 6 must be a number of key/value heads of 4 columns dividing heads (2)}}
  %o = mapp.cp_attention %q, %k, %k {heads = 2 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "ring"} : (tensor<1x4x8xf32>, tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

func.func @attn_rotary(%q: tensor<1x4x6xf32>) {
  // expected-error @+1 {{rotary needs an even head dim, got 3}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, rotary, members = 2 : i64, comm = "ring"} : (tensor<1x4x6xf32>, tensor<1x4x6xf32>, tensor<1x4x6xf32>) -> tensor<1x4x6xf32>
  return
}

// -----

func.func @attn_members(%q: tensor<1x4x8xf32>) {
  // expected-error @+1 {{members must be >= 1, got 0}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, members = 0 : i64, comm = "ring"} : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

func.func @attn_chunks(%q: tensor<1x3x8xf32>) {
  // expected-error @+1 {{the sequence share 3 must be two equal chunks}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "ring"} : (tensor<1x3x8xf32>, tensor<1x3x8xf32>, tensor<1x3x8xf32>) -> tensor<1x3x8xf32>
  return
}

// -----

func.func @attn_comm(%q: tensor<1x4x8xf32>) {
  // expected-error @+1 {{comm must be "ring" or "a2a", got "p2p"}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, members = 2 : i64, comm = "p2p"} : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

func.func @attn_a2a(%q: tensor<1x4x8xf32>) {
  // expected-error @+1 {{comm "a2a" splits the heads over the cp group: 2 heads and 2 key/value heads must be divisible by cp = 4}}
  %o = mapp.cp_attention %q, %q, %q {heads = 2 : i64, scale = 0.5 : f64, members = 4 : i64, comm = "a2a"} : (tensor<1x4x8xf32>, tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  return
}

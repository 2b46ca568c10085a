// RUN: mapp-opt %s -split-input-file -verify-diagnostics
// The model families' attention options and softcap (docs/models.md).

func.func @rotary_dim_without_rotary(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{rotary_dim needs rotary}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, rotary_dim = 4 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @rotary_dim_odd(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{rotary_dim must be even and in (0, head dim 8], got 3}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, rotary, rotary_dim = 3 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @softcap_negative(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{softcap must be > 0}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, softcap = -50.0 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @window_zero(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{sliding_window must be > 0}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, sliding_window = 0 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @window_not_causal(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{sliding_window needs causal}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, sliding_window = 4 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @dropout_one(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{dropout must be in [0, 1), got 1}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, dropout = 1.0 : f64, dropout_seed = 7 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @dropout_unseeded(%q: tensor<2x8x16xf32>) {
  // expected-error @+1 {{dropout needs dropout_seed}}
  %0 = mapp.attention %q, %q, %q {heads = 2 : i64, scale = 1.0 : f64, causal, dropout = 0.1 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @softcap_op_zero(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{cap must be > 0, got 0}}
  %0 = mapp.softcap %x {cap = 0.0 : f64} : tensor<4x8xf32>
  return
}

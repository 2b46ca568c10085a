// RUN: mapp-opt %s -split-input-file -verify-diagnostics

func.func @bad_reduction(%x: tensor<2x4xf32>) {
  // expected-error@+1 {{unknown reduction 'median'}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "max,median"} : tensor<2x4xf32>
  return
}

// -----

func.func @hist_range(%x: tensor<2x4xf32>) {
  // expected-error@+1 {{'hist' needs bins >= 1 and lo < hi}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "hist", bins = 4 : i64, lo = 1.0 : f64, hi = 0.0 : f64} : tensor<2x4xf32>
  return
}

// -----

func.func @attn_alone(%q: tensor<1x4x8xf32>) {
  // expected-error@+1 {{'attn' is the only reduction of a probe on q and k}}
  mapp.probe %q, %q {probe_id = 0 : i64, point = "p", reduce = "attn,max", heads = 2 : i64} : tensor<1x4x8xf32>, tensor<1x4x8xf32>
  return
}

// -----

func.func @every(%x: tensor<2x4xf32>) {
  // expected-error@+1 {{every must be >= 1}}
  mapp.probe %x {probe_id = 0 : i64, point = "x", reduce = "max", every = 0 : i64} : tensor<2x4xf32>
  return
}

// -----

func.func @perturb_kind(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error@+1 {{unknown perturbation kind 'dropout'}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "dropout", point = "x", target = "compute"} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @mask_channel(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error@+1 {{mask channel 4 outside the last dim}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "mask", point = "x", target = "compute", channels = array<i64: 1, 4>} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

// -----

func.func @target(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error@+1 {{target must be compute, storage or system}}
  %y = mapp.perturb %x {switch_id = 0 : i64, kind = "offset", point = "x", target = "disk"} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}

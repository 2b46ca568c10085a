// RUN: mapp-opt %s -split-input-file -verify-diagnostics
// Verifier diagnostics of ep_dispatch / ep_combine (MappMoeOps.cpp).

func.func @case0(%x: tensor<8x4xf32>, %c: tensor<6xi32>) {
  // expected-error @+1 {{6 experts cannot be split evenly over 4 members (num_moe_experts must be divisible by ep)}}
  %y = mapp.ep_dispatch %x, %c {members = 4 : i64} : (tensor<8x4xf32>, tensor<6xi32>) -> tensor<32x4xf32>
  return
}

// -----

func.func @case1(%x: tensor<8x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{members must be >= 1 (the expert-parallel group size), got 0}}
  %y = mapp.ep_dispatch %x, %c {members = 0 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  return
}

// -----

func.func @case2(%x: tensor<8x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{local_counts must be [2], got [4]}}
  %y, %lc = mapp.ep_dispatch %x, %c {members = 2 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> (tensor<16x4xf32>, tensor<4xi32>)
  return
}

// -----

func.func @case3(%x: tensor<8x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{operand [8,4] and result [16,5] must be [rows, ...] alike past the row dimension}}
  %y = mapp.ep_dispatch %x, %c {members = 2 : i64} : (tensor<8x4xf32>, tensor<4xi32>) -> tensor<16x5xf32>
  return
}

// -----

func.func @case4(%y: tensor<16x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{takes a group or ranks, not both}}
  %x = mapp.ep_combine %y, %c {members = 2 : i64, group = "ep", ranks = array<i64: 0, 1>} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @case5(%y: tensor<16x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{ranks lists 3 ranks but members is 2}}
  %x = mapp.ep_combine %y, %c {members = 2 : i64, ranks = array<i64: 0, 1, 2>} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @case6(%y: tensor<16x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{group must be tp, dp, pp, ep or edp, got "xp"}}
  %x = mapp.ep_combine %y, %c {members = 2 : i64, group = "xp"} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @case7(%y: tensor<16x4xf32>, %c: tensor<2x2xi32>) {
  // expected-error @+1 {{counts must have rank 1, got [2,2]}}
  %x = mapp.ep_combine %y, %c {members = 2 : i64} : (tensor<16x4xf32>, tensor<2x2xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @case8(%y: tensor<16x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{ranks must be distinct ranks >= 0}}
  %x = mapp.ep_combine %y, %c {members = 2 : i64, ranks = array<i64: 1, 1>} : (tensor<16x4xf32>, tensor<4xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @no_experts(%x: tensor<8x4xf32>, %c: tensor<0xi32>) {
  // expected-error @+1 {{counts must have one entry per expert, got [0]}}
  %y = mapp.ep_dispatch %x, %c {members = 1 : i64} : (tensor<8x4xf32>, tensor<0xi32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @scalar_rows(%x: tensor<f32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{rows must have rank >= 1}}
  %y = mapp.ep_dispatch %x, %c {members = 2 : i64} : (tensor<f32>, tensor<4xi32>) -> tensor<f32>
  return
}

// -----

func.func @no_rows(%x: tensor<0x4xf32>, %c: tensor<4xi32>) {
  // expected-error @+1 {{row counts must be >= 1, got [0,4] and [16,4]}}
  %y = mapp.ep_dispatch %x, %c {members = 2 : i64} : (tensor<0x4xf32>, tensor<4xi32>) -> tensor<16x4xf32>
  return
}

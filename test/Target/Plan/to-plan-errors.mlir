// RUN: mapp-opt %s -split-input-file -mapp-lower-to-plan -verify-diagnostics

// expected-error @+1 {{no function carries mapp.phase: run --mapp-autodiff (and --mapp-optimizer) first}}
module {
  func.func @forward() {
    return
  }
}

// -----

// expected-error @+1 {{unknown mapp.phase "sideways"}}
func.func @f() attributes {mapp.phase = "sideways"} {
  return
}

// -----

module attributes {mapp.parallel = {pp = 2 : i64}} {
  // expected-error @+1 {{mapp.stage 2 outside the pipeline (pp = 2)}}
  func.func @f() attributes {mapp.phase = "forward", mapp.stage = 2 : i64} {
    return
  }
}

// -----

// expected-error @+1 {{backward of stage 0 chunk 0 has no forward}}
func.func @b() attributes {mapp.phase = "backward"} {
  return
}

// -----

func.func @f(%t: tensor<2xi32>, %g: tensor<2xi32>) -> (tensor<f32>, tensor<2x4xf32>) attributes {mapp.phase = "forward"} {
  %x = mapp.fill 1.0 : tensor<2x4xf32>
  %l = mapp.cross_entropy %x, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l, %x : tensor<f32>, tensor<2x4xf32>
}
// expected-error @+1 {{arguments do not match the saved results of @f}}
func.func @b(%x: tensor<4x4xf32>) attributes {mapp.phase = "backward"} {
  return
}

// -----

func.func @f(%t: tensor<2xi32>, %g: tensor<2xi32>) -> tensor<f32> attributes {mapp.phase = "forward"} {
  %x = mapp.fill 1.0 : tensor<2x4xf32>
  // expected-error @+1 {{plan: 'func.call' has no plan kernel}}
  %y = func.call @helper(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
func.func private @helper(tensor<2x4xf32>) -> tensor<2x4xf32>

// -----

// expected-error @+1 {{plan: argument 2 of @f is neither an input nor a saved activation}}
func.func @f(%t: tensor<2xi32> {mapp.input = "tokens"}, %g: tensor<2xi32> {mapp.input = "targets"}, %extra: tensor<2x4xf32>) -> tensor<f32> attributes {mapp.phase = "forward"} {
  %l = mapp.cross_entropy %extra, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

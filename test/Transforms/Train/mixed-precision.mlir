// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="lr=1e-3 max-grad-norm=1.0" -mapp-mixed-precision="compute=fp16 master=f32 loss-scale=dynamic growth-interval=100 backoff-factor=0.25" | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="optimizer=sgd lr=0.1" -mapp-mixed-precision="compute=bf16 loss-scale=static:1024" | FileCheck %s --check-prefix=STATIC
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=bf16" | FileCheck %s --check-prefix=NONE

mapp.param @w : tensor<4x8xf32>
mapp.param @b : tensor<4xf32> {init = "zeros"}
func.func @forward(%t: tensor<2x8xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %x = mapp.fill 1.0 : tensor<2x8xf32>
  %w = mapp.param_ref @w : tensor<4x8xf32>
  %b = mapp.param_ref @b : tensor<4xf32>
  %y = mapp.linear %x, %w, %b : (tensor<2x8xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// The policy on the module; the forward's own fill is not the seed.
// CHECK: module attributes {mapp.precision = {compute = "fp16", loss_scale = "dynamic", master = "f32"}}
// CHECK: mapp.fill 1.000000e+00 : tensor<2x8xf32>
// The loss-gradient seed is scaled at run time.
// CHECK: mapp.fill 1.000000e+00 {loss_scale = "dynamic", mapp.loss_seed} : tensor<f32>
// Every update unscales; fp16's largest value is the overflow limit.
// CHECK: mapp.adamw @w, {{.*}}loss_scale = "dynamic", loss_scale_backoff = 2.500000e-01 : f64, loss_scale_growth = 2.000000e+00 : f64, loss_scale_growth_interval = 100 : i64, loss_scale_init = 6.553600e+04 : f64, loss_scale_limit = 6.550400e+04 : f64, loss_scale_min = 1.000000e+00 : f64
// CHECK: mapp.adamw @b, {{.*}}loss_scale = "dynamic"

// STATIC: mapp.fill 1.000000e+00 {loss_scale = "static", mapp.loss_seed} : tensor<f32>
// STATIC: mapp.sgd @w, {{.*}}loss_scale = "static", loss_scale_init = 1.024000e+03 : f64, loss_scale_limit = 3.40282{{[0-9]+}}E+38 : f64
// STATIC-NOT: loss_scale_backoff

// NONE: mapp.precision = {compute = "bf16", loss_scale = "none", master = "f32"}
// NONE-NOT: loss_scale =

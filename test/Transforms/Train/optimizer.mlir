// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="lr=1e-3 max-grad-norm=1.0 skip-decay-1d=true lr-schedule=cosine warmup=2 total-steps=10 min-lr=1e-4" | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="optimizer=sgd lr=0.1 momentum=0.9" | FileCheck %s --check-prefix=SGD

mapp.param @w : tensor<4x8xf32>
mapp.param @b : tensor<4xf32> {init = "zeros"}
mapp.param @unused : tensor<3xf32>
func.func @forward(%t: tensor<2x8xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %x = mapp.fill 1.0 : tensor<2x8xf32>
  %w = mapp.param_ref @w : tensor<4x8xf32>
  %b = mapp.param_ref @b : tensor<4xf32>
  %y = mapp.linear %x, %w, %b : (tensor<2x8xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @optimizer_step()
// CHECK-SAME: mapp.phase = "optimizer"
// CHECK: %[[GW:.*]] = mapp.grad_ref @w : tensor<4x8xf32>
// CHECK: %[[GB:.*]] = mapp.grad_ref @b : tensor<4xf32>
// CHECK: %[[N:.*]] = mapp.global_norm %[[GW]], %[[GB]]
// CHECK: mapp.adamw @w, %[[GW]] clip(%[[N]] : tensor<f32>) {lr = 1.000000e-03 : f64, max_norm = 1.000000e+00 : f64, min_lr = 1.000000e-04 : f64, schedule = "cosine", total_steps = 10 : i64, warmup = 2 : i64}
// 1-d parameters skip weight decay.
// CHECK: mapp.adamw @b, %[[GB]] clip(%[[N]] : tensor<f32>) {{{.*}}weight_decay = 0.000000e+00 : f64}
// CHECK-NOT: @unused

// SGD: mapp.sgd @w, %{{.*}} {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64}
// SGD-NOT: clip

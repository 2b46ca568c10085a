// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer="lr=1e-3" -mapp-mixed-precision="compute=fp8 fp8-history=4 fp8-margin=1" | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8 fp8-format=e4m3" | FileCheck %s --check-prefix=E4M3
// The plan lowering and the memory planner take the fp8 ops.
// RUN: mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8" -mapp-lower-to-plan -o /dev/null
// Applied twice: a clear error, not a second set of metas.
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8" -mapp-mixed-precision="compute=fp8" 2>&1 | FileCheck %s --check-prefix=TWICE

// A block linear (fp8) between an embedding-like input and an LM head
// (stays bf16): x -> layers.0.mlp.fc1 -> lm_head -> cross entropy.
mapp.param @layers.0.mlp.fc1.weight : tensor<16x32xf32>
mapp.param @layers.0.mlp.fc1.bias : tensor<16xf32> {init = "zeros"}
mapp.param @lm_head.weight : tensor<8x16xf32>
func.func @forward(%t: tensor<4x32xi32>, %g: tensor<4xi32>) -> tensor<f32> {
  %x = mapp.fill 1.0 : tensor<4x32xf32>
  %w = mapp.param_ref @layers.0.mlp.fc1.weight : tensor<16x32xf32>
  %b = mapp.param_ref @layers.0.mlp.fc1.bias : tensor<16xf32>
  %h = mapp.linear %x, %w, %b {mapp.name = "layers.0.mlp.fc1"} : (tensor<4x32xf32>, tensor<16x32xf32>, tensor<16xf32>) -> tensor<4x16xf32>
  %hw = mapp.param_ref @lm_head.weight : tensor<8x16xf32>
  %y = mapp.linear %h, %hw {mapp.name = "lm_head"} : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<4x8xf32>, tensor<4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK: module attributes {mapp.fp8 = {format = "hybrid", history = 4 : i64, layers = 1 : i64, margin = 1 : i64}, mapp.precision = {compute = "fp8", loss_scale = "none", master = "f32"}}
// The scaling state: 3 rows of (scale, 4 amaxes), a parameter.
// CHECK: mapp.param @layers.0.mlp.fc1.fp8_meta : tensor<15xf32> {init = "fp8_meta"}
// CHECK-LABEL: func.func @train_forward
// CHECK: %[[M:.*]] = mapp.param_ref @layers.0.mlp.fc1.fp8_meta : tensor<15xf32>
// CHECK: mapp.fp8_linear %{{.*}}, %{{.*}}, %{{.*}} meta(%[[M]]) {fast_accum, fp8_a = "e4m3", fp8_b = "e4m3", mapp.name = "layers.0.mlp.fc1", meta_a = 0 : i64, meta_b = 1 : i64}
// The LM head stays a plain linear.
// CHECK: mapp.linear %{{.*}}, %{{.*}} {mapp.name = "lm_head"}
// CHECK-LABEL: func.func @train_backward
// CHECK-NOT: mapp.fp8_matmul {{.*}}lm_head
// Input gradient dy·w: dy in E5M2 (row 2), w in E4M3 (row 1), no fast accumulation.
// CHECK: mapp.fp8_matmul %{{.*}}, %{{.*}} meta(%{{.*}}) {fp8_a = "e5m2", fp8_b = "e4m3", {{.*}}mapp.name = "layers.0.mlp.fc1.grad", meta_a = 2 : i64, meta_b = 1 : i64}
// Weight gradient dyᵀ·x: x in E4M3 (row 0).
// CHECK: mapp.fp8_matmul %{{.*}}, %{{.*}} meta(%{{.*}}) {fp8_a = "e5m2", fp8_b = "e4m3", mapp.name = "layers.0.mlp.fc1.grad", mapp.wgrad, meta_a = 2 : i64, meta_b = 0 : i64, transpose_a}
// CHECK-LABEL: func.func @optimizer_step
// CHECK: mapp.adamw @layers.0.mlp.fc1.weight
// CHECK-NOT: mapp.adamw @layers.0.mlp.fc1.fp8_meta
// CHECK: mapp.fp8_update @layers.0.mlp.fc1.fp8_meta {format_dy = "e5m2", format_w = "e4m3", format_x = "e4m3", history = 4 : i64, margin = 1 : i64}
// CHECK-NEXT: return

// E4M3: mapp.fp8_matmul {{.*}}fp8_a = "e4m3", fp8_b = "e4m3"
// E4M3: mapp.fp8_update @layers.0.mlp.fc1.fp8_meta {format_dy = "e4m3"

// TWICE: error: mapp-mixed-precision: compute=fp8 was applied already (the module has mapp.fp8)

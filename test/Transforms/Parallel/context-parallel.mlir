// RUN: mapp-opt %s -mapp-context-parallel="cp=2" | FileCheck %s
// RUN: mapp-opt %s -mapp-context-parallel="cp=2 comm=a2a" | FileCheck %s --check-prefix=A2A
// RUN: mapp-opt %s -mapp-context-parallel="cp=1" | FileCheck %s --check-prefix=CP1
// RUN: mapp-opt %s -mapp-context-parallel="cp=2" -mapp-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: not mapp-opt %s -mapp-context-parallel="cp=3" 2>&1 | FileCheck %s --check-prefix=SEQ
// RUN: not mapp-opt %s -mapp-context-parallel="cp=2 comm=a2a" -mapp-context-parallel="cp=2" 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not mapp-opt %s -mapp-context-parallel="cp=4 comm=a2a" 2>&1 | FileCheck %s --check-prefix=HEADS

// S = 8 tokens over cp = 2: rank r keeps chunks r and 3 - r of 2 tokens.
// CHECK: module attributes {mapp.parallel = {cp = 2 : i64, cp_comm = "ring"}}
// CHECK-LABEL: func.func @forward
// CHECK: %[[T:.*]] = mapp.cp_shard %arg0 {dim = 1 : i64, members = 2 : i64} : (tensor<2x8xi32>) -> tensor<2x4xi32>
// CHECK: mapp.embedding {{.*}}%[[T]]{{.*}} -> tensor<2x4x8xf32>
// CHECK: %[[P:.*]] = mapp.cp_shard %{{.*}} {dim = 0 : i64, members = 2 : i64} : (tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK: mapp.add %{{.*}}, %[[P]] {{.*}}: (tensor<2x4x8xf32>, tensor<4x8xf32>) -> tensor<2x4x8xf32>
// CHECK: mapp.cp_attention {{.*}}{causal, comm = "ring", heads = 2 : i64, members = 2 : i64, scale = {{.*}}} : (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
// CHECK: mapp.linear {{.*}} -> tensor<2x4x16xf32>
// CHECK: %[[Y:.*]] = mapp.cp_shard %arg1 {dim = 1 : i64{{.*}}} : (tensor<2x8xi32>) -> tensor<2x4xi32>
// CHECK: mapp.cross_entropy %{{.*}}, %[[Y]]

// A2A: mapp.cp_attention {{.*}}comm = "a2a"

// CP1-NOT: cp_
// CP1: mapp.attention

// The wpe gradient is the share placed into zeros; the attention's is cp_attention_grad.
// GRAD: mapp.cp_attention_grad {{.*}}comm = "ring"{{.*}} -> (tensor<2x4x8xf32>, tensor<2x4x8xf32>, tensor<2x4x8xf32>)
// GRAD: mapp.cp_unshard {{.*}}{dim = 0 : i64, members = 2 : i64} : (tensor<4x8xf32>) -> tensor<8x8xf32>

// SEQ: error: mapp-context-parallel: sequence length 8 is not divisible by 2·cp = 6
// TWICE: error: mapp-context-parallel: the module is already context parallel
// HEADS: context-parallel.mlir:{{[0-9]+}}:{{[0-9]+}}: error: mapp-context-parallel: cp-comm=a2a splits the heads over the cp group: 2 heads and 2 key/value heads (after tensor parallelism) must be divisible by cp=4
// HEADS-NEXT: "mapp.attention"

module {
  "mapp.param"() {sym_name = "wte", type = tensor<16x8xf32>, init = "zeros"} : () -> ()
  "mapp.param"() {sym_name = "wpe", type = tensor<8x8xf32>, init = "zeros"} : () -> ()
  func.func @forward(%tokens: tensor<2x8xi32>, %targets: tensor<2x8xi32>) -> tensor<f32> {
    %0 = "mapp.param_ref"() {param = @wte} : () -> tensor<16x8xf32>
    %1 = "mapp.embedding"(%0, %tokens) : (tensor<16x8xf32>, tensor<2x8xi32>) -> tensor<2x8x8xf32>
    %2 = "mapp.param_ref"() {param = @wpe} : () -> tensor<8x8xf32>
    %3 = "mapp.add"(%1, %2) : (tensor<2x8x8xf32>, tensor<8x8xf32>) -> tensor<2x8x8xf32>
    %4 = "mapp.attention"(%3, %3, %3) {heads = 2 : i64, scale = 0.5 : f64, causal} : (tensor<2x8x8xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>) -> tensor<2x8x8xf32>
    %5 = "mapp.linear"(%4, %0) : (tensor<2x8x8xf32>, tensor<16x8xf32>) -> tensor<2x8x16xf32>
    %6 = "mapp.cross_entropy"(%5, %targets) : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<f32>
    func.return %6 : tensor<f32>
  }
}

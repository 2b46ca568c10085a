// RUN: mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 pp=2 dp=2 chunks=2 microbatches=4 schedule=interleaved sequence-parallel=true zero1=true lr=1e-3" 2>/dev/null | FileCheck %s
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="microbatches=2" 2>/dev/null | FileCheck %s --check-prefix=SINGLE
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 pp=2 dp=2 microbatches=4 schedule=1f1b" 2>/dev/null | mapp-opt --mapp-verify-schedule | FileCheck %s --check-prefix=ROUNDTRIP
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=3" 2>&1 | FileCheck %s --check-prefix=TP3
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=4 chunks=2" 2>&1 | FileCheck %s --check-prefix=PP8

// Every stage of the pipeline shows in the result.
// CHECK: module attributes {{{.*}}mapp.parallel = {chunks = 2 : i64, dp = 2 : i64, microbatches = 4 : i64, pp = 2 : i64, schedule = "interleaved", tp = 2 : i64}}
// CHECK: mapp.param @layers.0.attn.qkv.weight : tensor<24x16xf32> {shard_blocks = 3 : i64, shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: func.func @forward_s0_c0(
// CHECK: mapp.reduce_scatter {{.*}}{dim = 1 : i64, group = "tp"}
// CHECK: mapp.send {{.*}} to 1 tag 0 : tensor<2x4x16xf32>
// CHECK: func.func @forward_s1_c1(
// CHECK-SAME: mapp.loss
// CHECK: mapp.ce_from_partials
// CHECK: func.func @backward_s0_c0(
// CHECK: mapp.grad_sync {{.*}}group = "dp", mode = "reduce_scatter"
// CHECK: func.func @backward_s1_c1(
// Loss scale 1/microbatches.
// CHECK: mapp.fill 2.500000e-01 {mapp.loss_seed} : tensor<f32>
// CHECK: func.func @optimizer_step()
// CHECK: mapp.adamw {{.*}}lr = 1.000000e-03 : f64, mapp.zero_shard = "dp"
// CHECK: mapp.param_gather
// CHECK: mapp.schedule "interleaved" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 1, 0>,

// One rank: plain autodiff functions and a sequential schedule.
// SINGLE: module attributes {{{.*}}mapp.parallel = {chunks = 1 : i64, dp = 1 : i64, microbatches = 2 : i64, pp = 1 : i64, schedule = "1f1b", tp = 1 : i64}}
// SINGLE: func.func @train_forward(
// SINGLE-SAME: mapp.loss
// SINGLE: func.func @train_backward(
// SINGLE: mapp.fill 5.000000e-01 {mapp.loss_seed} : tensor<f32>
// SINGLE-NOT: mapp.grad_sync
// SINGLE: func.func @optimizer_step()
// SINGLE: mapp.schedule "1f1b" {chunks = 1 : i64, microbatches = 2 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>]]}

// ROUNDTRIP: mapp.schedule "1f1b"

// TP3: error: mapp-tensor-parallel: tp=3 does not divide num_attention_heads=4
// PP8: error: mapp-pipeline-partition: pp=4 x chunks=2 = 8 pipeline stages need at least as many layers, the model has 4

// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2" 2>/dev/null | FileCheck %s
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2" -mlir-print-op-on-diagnostic=false -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 chunks=2" 2>/dev/null | FileCheck %s --check-prefix=INTER
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 chunks=2" -mlir-print-op-on-diagnostic=false -o /dev/null 2>&1 | FileCheck %s --check-prefix=INTER-REMARK
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2" -mapp-autodiff="loss-scale=0.25" 2>/dev/null | FileCheck %s --check-prefix=GRAD
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=4" -mapp-autodiff 2>/dev/null | mapp-opt -verify-each | FileCheck %s --check-prefix=PP4
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-tensor-parallel="tp=2 sequence-parallel=true" -mapp-pipeline-partition="pp=2" -mapp-autodiff 2>/dev/null | FileCheck %s --check-prefix=TPPP
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=1" | FileCheck %s --check-prefix=ONE

// Four GPT layers (Inputs/gen_gpt.py 4). The last stage also holds the
// final norm, the LM head and the loss, so the balanced cut is 2 | 2 and
// the cost remark shows the imbalance.
// REMARK: remark: pipeline partition into 2 stage(s) x 1 chunk(s): [stage 0 chunk 0: layers 0-1, 236544 FLOPs] [stage 1 chunk 0: layers 2-3, 276224 FLOPs]; per-stage FLOPs 236544 276224; imbalance (max/mean) 1.077
// CHECK: module attributes {{{.*}}mapp.parallel = {chunks = 1 : i64, pp = 2 : i64}}
// The tied embedding is read on both stages.
// CHECK: mapp.param @wte.weight : tensor<64x16xf32> {mapp.pp_stages = array<i64: 0, 1>}
// CHECK-NOT: @forward(
// CHECK-LABEL: func.func @forward_s0_c0(%arg0: tensor<2x8xi32> {mapp.input = "tokens"})
// CHECK-SAME: attributes {mapp.chunk = 0 : i64, mapp.phase = "forward", mapp.stage = 0 : i64}
// Parameter reads are cloned into each stage that uses them, first.
// CHECK: mapp.param_ref @layers.1.mlp.fc2.weight
// CHECK-NOT: @layers.2.
// CHECK: mapp.embedding
// The residual stream is the only value crossing the cut.
// CHECK: mapp.linear {{.*}}"layers.1.mlp.out"
// CHECK-NEXT: %[[X:.*]] = mapp.add
// CHECK-NEXT: mapp.send %[[X]] to 1 tag 0 : tensor<2x8x16xf32>
// CHECK-NEXT: return
// CHECK-LABEL: func.func @forward_s1_c0(%arg0: tensor<2x8xi32> {mapp.input = "targets"}) -> tensor<f32>
// CHECK-SAME: attributes {mapp.chunk = 0 : i64, mapp.loss, mapp.phase = "forward", mapp.stage = 1 : i64}
// CHECK-NEXT: mapp.recv from 0 tag 0 : tensor<2x8x16xf32>
// CHECK-NOT: @layers.1.
// CHECK: mapp.param_ref @wte.weight
// CHECK: mapp.cross_entropy

// Interleaved: virtual stage k on stage k mod 2 as chunk k / 2; chunk 1 of
// stage 0 receives from stage 1 (the wrap-around).
// INTER-REMARK: remark: pipeline partition into 2 stage(s) x 2 chunk(s): [stage 0 chunk 0: layers 0-0, {{[0-9]+}} FLOPs] [stage 1 chunk 0: layers 1-1, {{[0-9]+}} FLOPs] [stage 0 chunk 1: layers 2-2, {{[0-9]+}} FLOPs] [stage 1 chunk 1: layers 3-3, {{[0-9]+}} FLOPs]
// INTER-LABEL: func.func @forward_s0_c0
// INTER: mapp.send %{{.*}} to 1 tag 0
// INTER-LABEL: func.func @forward_s1_c0()
// INTER: mapp.recv from 0 tag 0
// INTER: mapp.send %{{.*}} to 0 tag 2
// INTER-LABEL: func.func @forward_s0_c1()
// INTER-SAME: mapp.chunk = 1 : i64, mapp.phase = "forward", mapp.stage = 0 : i64
// INTER: mapp.recv from 1 tag 2
// INTER: mapp.send %{{.*}} to 1 tag 4
// INTER-LABEL: func.func @forward_s1_c1
// INTER-SAME: mapp.loss
// INTER: mapp.recv from 0 tag 4

// Autodiff per stage: the forward returns its saved activations; the
// backward receives the output gradient (tag + 1) first, sends the input
// gradient back (tag + 1) last; the loss seed lives on the last stage.
// GRAD-LABEL: func.func @forward_s0_c0(%arg0: tensor<2x8xi32> {mapp.input = "tokens"}) -> (
// GRAD: mapp.send %{{.*}} to 1 tag 0
// GRAD-NOT: _grad
// GRAD: return
// GRAD-LABEL: func.func @forward_s1_c0(%arg0: tensor<2x8xi32> {mapp.input = "targets"}) -> (tensor<f32>,
// GRAD-SAME: mapp.loss
// GRAD: mapp.recv from 0 tag 0
// GRAD-NOT: _grad
// GRAD: return
// GRAD-LABEL: func.func @backward_s0_c0(
// GRAD-SAME: attributes {mapp.chunk = 0 : i64, mapp.phase = "backward", mapp.stage = 0 : i64}
// GRAD: mapp.recv from 1 tag 1 {{.*}}: tensor<2x8x16xf32>
// GRAD-NOT: mapp.send
// GRAD: mapp.embedding_grad
// GRAD: mapp.grad_accumulate @wte.weight
// GRAD-LABEL: func.func @backward_s1_c0(
// GRAD: mapp.fill 2.500000e-01 {mapp.loss_seed} : tensor<f32>
// GRAD: mapp.cross_entropy_grad
// GRAD: mapp.send %{{.*}} to 0 tag 1 {{.*}}: tensor<2x8x16xf32>
// GRAD: mapp.grad_accumulate @wte.weight
// GRAD: return

// PP4: func.func @forward_s0_c0
// PP4: func.func @forward_s1_c0
// PP4: func.func @forward_s2_c0
// PP4: func.func @forward_s3_c0
// PP4: func.func @backward_s0_c0
// PP4: func.func @backward_s1_c0
// PP4: func.func @backward_s2_c0
// PP4: func.func @backward_s3_c0

// Tensor + sequence parallel inside pipeline stages: the residual stream
// crossing the cut is the sequence shard.
// TPPP: func.func @forward_s0_c0
// TPPP: mapp.send %{{.*}} to 1 tag 0 : tensor<2x4x16xf32>
// TPPP: func.func @backward_s0_c0
// TPPP: mapp.recv from 1 tag 1 {{.*}}: tensor<2x4x16xf32>

// ONE: module attributes {{{.*}}mapp.parallel = {chunks = 1 : i64, pp = 1 : i64}}
// ONE: func.func @forward(

// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 dp=2 microbatches=4 schedule=zb-h1" 2>/dev/null | FileCheck %s
// RUN: not mapp-opt %s -split-input-file -mapp-split-backward 2>/dev/null | FileCheck %s --check-prefix=SMALL
// RUN: not mapp-opt %s -split-input-file -mapp-split-backward 2>&1 | FileCheck %s --check-prefix=ERR
// The plan of a split step has BackwardInput and BackwardWeight blocks.
// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 microbatches=2 schedule=zb-h1" -mapp-plan-memory -mapp-lower-to-plan 2>/dev/null | mapp-translate --mapp-to-plan -o %t/p.mplan
// RUN: flatc --json --raw-binary --strict-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/p.mplan
// RUN: FileCheck %s --check-prefix=PLAN < %t/p.json

// The last stage's backward keeps the input gradient and its send; the
// weight part takes every grad_accumulate and the dp grad_syncs, and reads
// what the input part returns.
// CHECK-LABEL: func.func @backward_s1_c0(
// CHECK-SAME: attributes {mapp.chunk = 0 : i64, mapp.phase = "backward", mapp.split = "input", mapp.stage = 1 : i64}
// CHECK-NOT: mapp.grad_accumulate
// CHECK-NOT: mapp.grad_sync
// CHECK: mapp.send {{.*}} to 0 tag 1
// CHECK-NOT: mapp.grad_accumulate
// CHECK: return
// CHECK-LABEL: func.func @backward_s1_c0_weight(
// CHECK-SAME: attributes {mapp.chunk = 0 : i64, mapp.phase = "backward", mapp.split = "weight", mapp.stage = 1 : i64}
// CHECK-NOT: mapp.send
// CHECK: mapp.grad_accumulate
// CHECK: mapp.grad_sync {{.*}}group = "dp"
// CHECK: mapp.schedule "zb-h1"

// PLAN: "kind": "BackwardInput"
// PLAN: "kind": "BackwardWeight"

// A small backward: the input gradient %dx is sent; %dw only feeds the
// accumulation, so it and the transpose move to W, which reads %x and %dy.
// SMALL-LABEL: func.func @bwd(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
// SMALL-SAME: mapp.split = "input"
// SMALL: %[[DX:.*]] = mapp.linear
// SMALL: mapp.send %[[DX]] to 0 tag 1
// SMALL-NOT: mapp.matmul
// SMALL: return %arg1, %arg0
// SMALL-LABEL: func.func @bwd_weight(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>)
// SMALL-SAME: mapp.split = "weight"
// SMALL: mapp.transpose %arg0
// SMALL: mapp.matmul
// SMALL: mapp.grad_accumulate @w
module {
  mapp.param @w : tensor<8x8xf32>
  func.func @bwd(%x: tensor<4x8xf32>, %dy: tensor<4x8xf32>) attributes {mapp.phase = "backward", mapp.stage = 1 : i64} {
    %w = mapp.param_ref @w : tensor<8x8xf32>
    %dx = mapp.linear %dy, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    mapp.send %dx to 0 tag 1 : tensor<4x8xf32>
    %dyt = mapp.transpose %dy {perm = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
    %dw = mapp.matmul %dyt, %x : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    mapp.grad_accumulate @w, %dw : tensor<8x8xf32>
    return
  }
}

// -----

// ERR: error: mapp-split-backward: no unsplit backward function (mapp.phase = "backward"); run --mapp-autodiff first
module {
}

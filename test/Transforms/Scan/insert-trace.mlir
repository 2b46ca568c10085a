// RUN: mapp-opt %s -mapp-insert-trace="granularity=layer every=10 window=2" | FileCheck %s --check-prefix=LAYER
// RUN: mapp-opt %s -mapp-insert-trace="granularity=op" | FileCheck %s --check-prefix=OP
// RUN: mapp-opt %s -mapp-insert-trace="granularity=stage" | FileCheck %s --check-prefix=STAGE

module attributes {mapp.parallel = {tp = 2 : i64}} {
  mapp.param @w : tensor<8x8xf32>
  func.func @f(%x: tensor<2x8xf32>) attributes {mapp.phase = "forward"} {
    %w = mapp.param_ref @w : tensor<8x8xf32>
    %a = mapp.linear %x, %w {mapp.name = "layers.0.attn.qkv"} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
    %b = mapp.gelu %a {mapp.name = "layers.0.mlp.act"} : tensor<2x8xf32>
    %c = mapp.all_reduce %b {group = "tp", mapp.name = "layers.0.mlp.allreduce"} : (tensor<2x8xf32>) -> tensor<2x8xf32>
    %d = mapp.gelu %c {mapp.name = "layers.1.mlp.act"} : tensor<2x8xf32>
    mapp.send %d to 1 tag 0 : tensor<2x8xf32>
    return
  }
  func.func @o() attributes {mapp.phase = "optimizer"} {
    %g = mapp.grad_ref @w : tensor<8x8xf32>
    mapp.sgd @w, %g {lr = 0.1 : f64} : tensor<8x8xf32>
    return
  }
}

// LAYER: module attributes {mapp.parallel = {tp = 2 : i64}, mapp.trace = {every = 10 : i64, granularity = "layer", window = 2 : i64}}
// LAYER: mapp.param_ref @w
// LAYER-NEXT: mapp.trace_begin 0 "layers.0 forward" "compute" {layer = 0 : i64}
// LAYER-NEXT: mapp.linear
// LAYER-NEXT: mapp.gelu
// LAYER-NEXT: mapp.trace_end 0
// The all-reduce is a region of its own, with bytes and group.
// LAYER-NEXT: mapp.trace_begin 1 "layers.0.mlp.allreduce forward" "comm" {bytes = 64 : i64, group = "tp", layer = 0 : i64}
// LAYER-NEXT: mapp.all_reduce
// LAYER-NEXT: mapp.trace_end 1
// LAYER-NEXT: mapp.trace_begin 2 "layers.1 forward" "compute" {layer = 1 : i64}
// LAYER-NEXT: mapp.gelu
// LAYER-NEXT: mapp.trace_end 2
// LAYER-NEXT: mapp.trace_begin 3 "send forward" "comm" {bytes = 64 : i64, peer = 1 : i64}
// LAYER-NEXT: mapp.send
// LAYER-NEXT: mapp.trace_end 3
// LAYER: mapp.trace_begin 4 "sgd optimizer" "optimizer"
// LAYER-NEXT: mapp.sgd

// OP-COUNT-6: mapp.trace_begin
// OP-NOT: mapp.trace_begin

// STAGE: mapp.trace_begin 0 "stage forward" "compute"
// STAGE-NEXT: mapp.linear
// STAGE-NEXT: mapp.gelu
// STAGE-NEXT: mapp.trace_end 0
// STAGE-NEXT: mapp.trace_begin 1 {{.*}} "comm"

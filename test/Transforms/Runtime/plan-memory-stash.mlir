// RUN: not mapp-opt %s -split-input-file -mapp-plan-memory -mlir-print-op-on-diagnostic=false 2>&1 >/dev/null | FileCheck %s
// RUN: not mapp-opt %s -split-input-file -mapp-plan-memory 2>/dev/null | FileCheck %s --check-prefix=ATTR

// The stash is what a forward keeps for its backward: here one saved
// tensor<4x64x64xf32> = 65536 B per (chunk, microbatch). GPipe keeps all
// three microbatches' stashes (3 x 65536 = 196608 B), 1F1B on one stage
// one at a time.
// CHECK: remark: memory plan, stage 0: {{.*}}; stash 65536 B per (chunk, microbatch); gpipe: 3 in flight, 196608 B stashed; 1f1b: 1 in flight, 65536 B stashed
// ATTR: stash_bytes = 65536 : i64

module attributes {mapp.parallel = {microbatches = 3 : i64, schedule = "gpipe"}} {
  mapp.param @w : tensor<64x64xf32>
  func.func @fwd(%t: tensor<4x64xi32> {mapp.input = "tokens"}, %g: tensor<4x64xi32> {mapp.input = "targets"}) -> (tensor<f32>, tensor<4x64x64xf32>) attributes {mapp.phase = "forward"} {
    %w = mapp.param_ref @w : tensor<64x64xf32>
    %x = mapp.embedding %w, %t : (tensor<64x64xf32>, tensor<4x64xi32>) -> tensor<4x64x64xf32>
    %a = mapp.gelu %x : tensor<4x64x64xf32>
    %l = mapp.cross_entropy %a, %g : (tensor<4x64x64xf32>, tensor<4x64xi32>) -> tensor<f32>
    return %l, %a : tensor<f32>, tensor<4x64x64xf32>
  }
  func.func @bwd(%a: tensor<4x64x64xf32>) attributes {mapp.phase = "backward"} {
    %d = mapp.gelu %a : tensor<4x64x64xf32>
    return
  }
  mapp.schedule "gpipe" {microbatches = 3 : i64, chunks = 1 : i64, tables = [
    [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>]]}
  mapp.schedule "1f1b" {microbatches = 3 : i64, chunks = 1 : i64, tables = [
    [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 2>]]}
}

// -----

// An adaptive cap below what the dfc table needs (the pool: w and its
// gradient, 2 x 16384 B, plus its one arena slot) is an error naming the
// constraint.
// CHECK: error: adaptive schedule: mem-cap 40000 B is below what the dfc table needs on stage 0: persistent 32768 B + 1 arena slot(s) x [[ARENA:[0-9]+]] B = {{[0-9]+}} B

module attributes {mapp.parallel = {microbatches = 2 : i64, schedule = "adaptive"}, mapp.adaptive = {mem_cap_bytes = 40000 : i64, slow_link_ratio = 1.5 : f64, bandwidth_smoothing = 0.25 : f64}} {
  mapp.param @w : tensor<64x64xf32>
  func.func @fwd(%t: tensor<4x64xi32> {mapp.input = "tokens"}, %g: tensor<4x64xi32> {mapp.input = "targets"}) -> (tensor<f32>, tensor<4x64x64xf32>) attributes {mapp.phase = "forward"} {
    %w = mapp.param_ref @w : tensor<64x64xf32>
    %x = mapp.embedding %w, %t : (tensor<64x64xf32>, tensor<4x64xi32>) -> tensor<4x64x64xf32>
    %a = mapp.gelu %x : tensor<4x64x64xf32>
    %l = mapp.cross_entropy %a, %g : (tensor<4x64x64xf32>, tensor<4x64xi32>) -> tensor<f32>
    return %l, %a : tensor<f32>, tensor<4x64x64xf32>
  }
  func.func @bwd(%a: tensor<4x64x64xf32>) attributes {mapp.phase = "backward"} {
    %d = mapp.gelu %a : tensor<4x64x64xf32>
    return
  }
}

// -----

// Without its policy an adaptive module is malformed.
// CHECK: error: schedule "adaptive" needs the mapp.adaptive policy (run --mapp-pipeline-schedule)
module attributes {mapp.parallel = {microbatches = 2 : i64, schedule = "adaptive"}} {
}

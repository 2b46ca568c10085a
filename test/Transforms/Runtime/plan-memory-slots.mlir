// RUN: mapp-opt %s -mapp-plan-memory -mlir-print-op-on-diagnostic=false 2>&1 | FileCheck %s

// The 1F1B table of stage 0 with 2 stages keeps 2 microbatches in flight:
// two activation slots. Stage 1 runs F/B alternately: one slot.
// CHECK: remark: memory plan, stage 0: {{.*}} + 2 slot(s) x arena
// CHECK: remark: memory plan, stage 1: {{.*}} + 1 slot(s) x arena

module attributes {mapp.parallel = {pp = 2 : i64, microbatches = 3 : i64, schedule = "1f1b"}} {
  mapp.param @w0 : tensor<8x8xf32>
  mapp.param @w1 : tensor<8x8xf32>
  func.func @f0(%t: tensor<2x4xi32> {mapp.input = "tokens"}) -> tensor<2x4x8xf32> attributes {mapp.phase = "forward", mapp.stage = 0 : i64} {
    %w = mapp.param_ref @w0 : tensor<8x8xf32>
    %x = mapp.embedding %w, %t : (tensor<8x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
    mapp.send %x to 1 tag 0 : tensor<2x4x8xf32>
    return %x : tensor<2x4x8xf32>
  }
  func.func @f1(%g: tensor<2x4xi32> {mapp.input = "targets"}) -> tensor<f32> attributes {mapp.phase = "forward", mapp.stage = 1 : i64, mapp.loss} {
    %x = mapp.recv from 0 tag 0 : tensor<2x4x8xf32>
    %w = mapp.param_ref @w1 : tensor<8x8xf32>
    %y = mapp.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %l = mapp.cross_entropy %y, %g : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
    return %l : tensor<f32>
  }
  mapp.schedule "1f1b" {microbatches = 3 : i64, chunks = 1 : i64, tables = [
    [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>],
    [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 2>]]}
}

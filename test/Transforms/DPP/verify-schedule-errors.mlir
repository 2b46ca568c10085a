// RUN: mapp-opt %s -split-input-file -mapp-verify-schedule -verify-diagnostics

// Rank 0 waits for B(0, 0)'s gradient before sending F(0, 1); rank 1 runs
// F(0, 1) before B(0, 0): each waits for the other.
// expected-error @+1 {{mapp-verify-schedule: deadlock: rank 0 waits at task #1 B(chunk 0, mb 0) for the gradient of virtual stage 1 (rank 1, chunk 0); rank 1 waits at task #1 F(chunk 0, mb 1) for the activation of virtual stage 0 (rank 0, chunk 0)}}
mapp.schedule "custom" {microbatches = 2 : i64, chunks = 1 : i64, tables = [
  [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>],
  [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 0>]]}

// -----

// A cycle through the interleaved chunk wrap-around (virtual stage 1 =
// rank 1 chunk 0 feeds virtual stage 2 = rank 0 chunk 1): rank 0 starts
// with chunk 1, which needs rank 1's chunk 0, which needs rank 0's chunk 0.
// expected-error @+1 {{mapp-verify-schedule: deadlock: rank 0 waits at task #0 F(chunk 1, mb 0) for the activation of virtual stage 1 (rank 1, chunk 0); rank 1 waits at task #0 F(chunk 0, mb 0) for the activation of virtual stage 0 (rank 0, chunk 0)}}
mapp.schedule "custom" {microbatches = 1 : i64, chunks = 2 : i64, tables = [
  [#mapp.task<F, 1, 0>, #mapp.task<F, 0, 0>, #mapp.task<B, 1, 0>, #mapp.task<B, 0, 0>],
  [#mapp.task<F, 0, 0>, #mapp.task<F, 1, 0>, #mapp.task<B, 1, 0>, #mapp.task<B, 0, 0>]]}

// -----

// expected-error @+1 {{mapp-verify-schedule: rank 1: B(chunk 0, mb 0) (task #0) runs before F(chunk 0, mb 0) on the same rank}}
mapp.schedule "custom" {microbatches = 1 : i64, chunks = 1 : i64, tables = [
  [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>],
  [#mapp.task<B, 0, 0>, #mapp.task<F, 0, 0>]]}

// -----

// expected-error @+1 {{mapp-verify-schedule: rank 0: W(chunk 0, mb 0) (task #1) runs before Bi(chunk 0, mb 0) on the same rank}}
mapp.schedule "custom" {microbatches = 1 : i64, chunks = 1 : i64, tables = [
  [#mapp.task<F, 0, 0>, #mapp.task<W, 0, 0>, #mapp.task<Bi, 0, 0>]]}

// -----

// A split backward (zero-bubble style) that is valid: no diagnostic.
mapp.schedule "zb" {microbatches = 2 : i64, chunks = 1 : i64, tables = [
  [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<Bi, 0, 0>, #mapp.task<Bi, 0, 1>, #mapp.task<W, 0, 0>, #mapp.task<W, 0, 1>],
  [#mapp.task<F, 0, 0>, #mapp.task<Bi, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<Bi, 0, 1>, #mapp.task<W, 0, 0>, #mapp.task<W, 0, 1>]]}

// -----

// Transfers between stage functions must pair up by (stages, tag, type).
func.func @forward_s0_c0(%x: tensor<4xf32>) attributes {mapp.phase = "forward", mapp.stage = 0 : i64, mapp.chunk = 0 : i64} {
  // expected-error @+1 {{mapp-verify-schedule: send from stage 0 to stage 1 with tag 2 has no matching recv on stage 1}}
  mapp.send %x to 1 tag 2 : tensor<4xf32>
  return
}
func.func @forward_s1_c0() attributes {mapp.phase = "forward", mapp.stage = 1 : i64, mapp.chunk = 0 : i64} {
  %y = mapp.recv from 0 tag 0 : tensor<4xf32>
  return
}

// -----

func.func @forward_s0_c0(%x: tensor<4xf32>) attributes {mapp.phase = "forward", mapp.stage = 0 : i64, mapp.chunk = 0 : i64} {
  mapp.send %x to 1 tag 0 : tensor<4xf32>
  return
}
func.func @forward_s1_c0() attributes {mapp.phase = "forward", mapp.stage = 1 : i64, mapp.chunk = 0 : i64} {
  // expected-error @+1 {{mapp-verify-schedule: recv from stage 0 to stage 1 with tag 0 expects 'tensor<8xf32>' but the send carries 'tensor<4xf32>'}}
  %y = mapp.recv from 0 tag 0 : tensor<8xf32>
  return
}

// RUN: mapp-opt %s -mapp-autodiff="loss-scale=0.5" | FileCheck %s
// RUN: mapp-opt %s -mapp-autodiff | mapp-opt -verify-each | FileCheck %s --check-prefix=ROUNDTRIP

// A tied embedding (used by the lookup and by the LM head) and a bias with
// fan-out exercise gradient accumulation.
mapp.param @wte : tensor<16x8xf32>
mapp.param @fc.weight : tensor<8x8xf32>
mapp.param @fc.bias : tensor<8xf32> {init = "zeros"}

func.func @forward(%tokens: tensor<2x4xi32>, %targets: tensor<2x4xi32>) -> tensor<f32> {
  %wte = mapp.param_ref @wte : tensor<16x8xf32>
  %x = mapp.embedding %wte, %tokens : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %w = mapp.param_ref @fc.weight : tensor<8x8xf32>
  %b = mapp.param_ref @fc.bias : tensor<8xf32>
  %h = mapp.linear %x, %w, %b : (tensor<2x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %a = mapp.gelu %h : tensor<2x4x8xf32>
  %r = mapp.add %a, %b : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %logits = mapp.linear %r, %wte : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %loss = mapp.cross_entropy %logits, %targets : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// The forward returns the loss and every activation the backward needs.
// CHECK-LABEL: func.func @train_forward
// CHECK-SAME: (%[[TOK:.*]]: tensor<2x4xi32>, %[[TGT:.*]]: tensor<2x4xi32>)
// CHECK-SAME: -> (tensor<f32>, {{.*}})
// CHECK-SAME: mapp.phase = "forward"
// CHECK-NOT: _grad
// CHECK: return

// CHECK-LABEL: func.func @train_backward
// CHECK-SAME: mapp.phase = "backward"
// Parameters are re-read, not saved.
// CHECK-DAG: mapp.param_ref @wte
// CHECK-DAG: mapp.param_ref @fc.weight
// CHECK: %[[SEED:.*]] = mapp.fill 5.000000e-01 {mapp.loss_seed} : tensor<f32>
// CHECK: mapp.cross_entropy_grad %[[SEED]]
// The LM head's weight gradient is a weight-gradient op.
// CHECK: mapp.matmul {{.*}} {mapp.wgrad, transpose_a} : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
// The bias fans out (linear + add): both contributions are summed.
// CHECK: mapp.reduce_sum {{.*}} {dims = array<i64: 0, 1>}
// CHECK: mapp.gelu_grad
// CHECK: mapp.reduce_sum {{.*}} {dims = array<i64: 0, 1>, mapp.wgrad}
// CHECK: mapp.embedding_grad {{.*}} {mapp.wgrad, vocab = 16 : i64}
// Tied embedding: the lookup's and the head's gradients are added.
// CHECK: %[[TIED:.*]] = mapp.add
// CHECK: mapp.grad_accumulate @wte, %[[TIED]] : tensor<16x8xf32>
// CHECK: mapp.grad_accumulate @fc.weight
// CHECK: mapp.grad_accumulate @fc.bias
// CHECK-NOT: mapp.grad_accumulate
// CHECK: return

// ROUNDTRIP: func.func @train_forward
// ROUNDTRIP: func.func @train_backward

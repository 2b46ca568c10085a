// RUN: mapp-opt %s -mapp-tensor-parallel="tp=2" | FileCheck %s
// RUN: mapp-opt %s -mapp-tensor-parallel="tp=2 sequence-parallel=true" | FileCheck %s --check-prefix=SP
// RUN: mapp-opt %s -mapp-tensor-parallel="tp=2" -mapp-autodiff | FileCheck %s --check-prefix=GRAD
// RUN: mapp-opt %s -mapp-tensor-parallel="tp=2 sequence-parallel=true" -mapp-autodiff | FileCheck %s --check-prefix=SPGRAD
// RUN: mapp-opt %s -mapp-tensor-parallel="tp=1" | FileCheck %s --check-prefix=TP1

// One GPT layer (Inputs/gen_gpt.py 1): hidden 16, 4 heads, ffn 64, vocab 64.

// Column-parallel weights shard rows; the fused qkv shards each of its three
// blocks; row-parallel weights shard columns and keep their bias whole.
// CHECK: module attributes {{{.*}}mapp.parallel = {tp = 2 : i64}}
// CHECK: mapp.param @wte.weight : tensor<32x16xf32> {shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: mapp.param @wpe.weight : tensor<8x16xf32>{{$}}
// CHECK: mapp.param @layers.0.attn.qkv.weight : tensor<24x16xf32> {shard_blocks = 3 : i64, shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.attn.qkv.bias : tensor<24xf32> {init = "zeros", shard_blocks = 3 : i64, shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.attn.proj.weight : tensor<16x8xf32> {shard_dim = 1 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.attn.proj.bias : tensor<16xf32> {init = "zeros"}{{$}}
// CHECK: mapp.param @layers.0.mlp.fc1.weight : tensor<32x16xf32> {shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.mlp.fc1.bias : tensor<32xf32> {init = "zeros", shard_dim = 0 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.mlp.fc2.weight : tensor<16x32xf32> {shard_dim = 1 : i64, shard_group = "tp"}
// CHECK: mapp.param @layers.0.mlp.fc2.bias : tensor<16xf32> {init = "zeros"}{{$}}

// Vocab-parallel embedding: partial rows summed over tp.
// CHECK: %[[E:.*]] = mapp.embedding %{{.*}}, %arg0 {group = "tp"} : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
// CHECK: mapp.all_reduce %[[E]] {group = "tp"}
// Attention: f before the fused qkv, per-rank [q|k|v] slices of H/tp, heads/tp.
// CHECK: %[[LN1:.*]] = mapp.layer_norm
// CHECK: %[[F1:.*]] = mapp.copy_to_group %[[LN1]] {group = "tp"} : tensor<2x8x16xf32>
// CHECK: %[[QKV:.*]] = mapp.linear %[[F1]], {{.*}} -> tensor<2x8x24xf32>
// CHECK: %[[Q:.*]] = mapp.slice %[[QKV]] {dim = 2 : i64, end = 8 : i64, start = 0 : i64}
// CHECK: %[[K:.*]] = mapp.slice %[[QKV]] {dim = 2 : i64, end = 16 : i64, start = 8 : i64}
// CHECK: %[[V:.*]] = mapp.slice %[[QKV]] {dim = 2 : i64, end = 24 : i64, start = 16 : i64}
// CHECK: %[[A:.*]] = mapp.attention %[[Q]], %[[K]], %[[V]] {causal, heads = 2 : i64
// Row-parallel projection: no bias in the partial product, g, then the bias.
// CHECK: %[[PB:.*]] = mapp.param_ref @layers.0.attn.proj.bias
// CHECK: %[[P:.*]] = mapp.linear %[[A]], %{{[0-9]+}} : (tensor<2x8x8xf32>, tensor<16x8xf32>) -> tensor<2x8x16xf32>
// CHECK: %[[R:.*]] = mapp.all_reduce %[[P]] {group = "tp"}
// The value's name moves to the full (reduced, biased) output.
// CHECK: mapp.add %[[R]], %[[PB]] {mapp.name = "layers.0.attn.out"}
// MLP: fc1 column-parallel, gelu on the shard, fc2 row-parallel.
// CHECK: mapp.copy_to_group
// CHECK: mapp.linear {{.*}} -> tensor<2x8x32xf32>
// CHECK: mapp.gelu {{.*}} : tensor<2x8x32xf32>
// CHECK: mapp.linear {{.*}} : (tensor<2x8x32xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
// CHECK: mapp.all_reduce
// Vocab-parallel cross-entropy.
// CHECK: %[[LG:.*]] = mapp.linear {{.*}} {mapp.name = "logits"} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
// CHECK: %[[M:.*]] = mapp.reduce_max %[[LG]] {dims = array<i64: 2>}
// CHECK: %[[GM:.*]] = mapp.all_reduce %[[M]] {group = "tp", reduction = "max"}
// CHECK: %[[PT:.*]] = mapp.vocab_ce_partials %[[LG]], %arg1, %[[GM]] {group = "tp"} : {{.*}} -> tensor<2x8x2xf32>
// CHECK: %[[S:.*]] = mapp.all_reduce %[[PT]] {group = "tp"}
// CHECK: %[[L:.*]] = mapp.ce_from_partials %[[S]], %arg1
// CHECK: return %[[L]]

// Sequence parallel: reduce-scatter / all-gather along the sequence, norms on
// [B, T/tp, H], position embedding cut, norm parameters' gradients summed (f).
// SP: %[[E:.*]] = mapp.embedding
// SP: mapp.reduce_scatter %[[E]] {dim = 1 : i64, group = "tp"} : (tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
// SP: mapp.scatter_to_group %{{.*}} {dim = 0 : i64, group = "tp"} : (tensor<8x16xf32>) -> tensor<4x16xf32>
// SP: mapp.copy_to_group %{{.*}} {group = "tp"} : tensor<16xf32>
// SP: %[[LN:.*]] = mapp.layer_norm {{.*}} -> tensor<2x4x16xf32>
// SP: mapp.all_gather %[[LN]] {dim = 1 : i64, group = "tp"} : (tensor<2x4x16xf32>) -> tensor<2x8x16xf32>
// SP: mapp.reduce_scatter {{.*}} {dim = 1 : i64, group = "tp"}
// SP-NOT: mapp.all_reduce {{.*}} {group = "tp"} : (tensor<2x8x16xf32>)
// SP: mapp.ce_from_partials

// The gradients: f all-reduces in the backward, g is the identity; one
// backward all-reduce per column-parallel entry (qkv, fc1, LM head).
// GRAD-LABEL: func.func @train_forward
// GRAD-COUNT-5: mapp.all_reduce
// GRAD-NOT: mapp.all_reduce
// GRAD-LABEL: func.func @train_backward
// GRAD: mapp.vocab_ce_partials_grad
// GRAD-COUNT-3: mapp.all_reduce {{.*}} {group = "tp"} : (tensor<2x8x16xf32>)
// GRAD-NOT: mapp.all_reduce
// GRAD: mapp.embedding_grad {{.*}} {group = "tp", mapp.wgrad, vocab = 32 : i64}

// SPGRAD-LABEL: func.func @train_backward
// SPGRAD-DAG: mapp.reduce_scatter {{.*}} {dim = 1 : i64, group = "tp"}
// SPGRAD-DAG: mapp.all_gather {{.*}} {dim = 1 : i64, group = "tp"}
// SPGRAD-DAG: mapp.all_reduce {{.*}} {group = "tp"} : (tensor<16xf32>)

// TP1: mapp.parallel = {tp = 1 : i64}
// TP1-NOT: shard_dim
// TP1-NOT: copy_to_group

module attributes {mapp.model = {kind = "gpt", num_layers = 1 : i64, hidden_size = 16 : i64, num_attention_heads = 4 : i64, ffn_hidden_size = 64 : i64, vocab_size = 64 : i64, seq_length = 8 : i64}} {
  mapp.param @"wte.weight" : tensor<64x16xf32>
  mapp.param @"wpe.weight" : tensor<8x16xf32>
  mapp.param @"layers.0.ln1.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.0.ln1.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.0.attn.qkv.weight" : tensor<48x16xf32>
  mapp.param @"layers.0.attn.qkv.bias" : tensor<48xf32> {init = "zeros"}
  mapp.param @"layers.0.attn.proj.weight" : tensor<16x16xf32>
  mapp.param @"layers.0.attn.proj.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.0.ln2.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.0.ln2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.0.mlp.fc1.weight" : tensor<64x16xf32>
  mapp.param @"layers.0.mlp.fc1.bias" : tensor<64xf32> {init = "zeros"}
  mapp.param @"layers.0.mlp.fc2.weight" : tensor<16x64xf32>
  mapp.param @"layers.0.mlp.fc2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"ln_f.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"ln_f.bias" : tensor<16xf32> {init = "zeros"}
  func.func @forward(%tokens: tensor<2x8xi32>, %targets: tensor<2x8xi32>) -> tensor<f32> {
    %v1 = mapp.param_ref @"wte.weight" : tensor<64x16xf32>
    %v2 = mapp.embedding %v1, %tokens : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
    %v3 = mapp.param_ref @"wpe.weight" : tensor<8x16xf32>
    %v4 = mapp.add %v2, %v3 : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
    %v5 = mapp.param_ref @"layers.0.ln1.weight" : tensor<16xf32>
    %v6 = mapp.param_ref @"layers.0.ln1.bias" : tensor<16xf32>
    %v7 = mapp.layer_norm %v4, %v5, %v6 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v8 = mapp.param_ref @"layers.0.attn.qkv.weight" : tensor<48x16xf32>
    %v9 = mapp.param_ref @"layers.0.attn.qkv.bias" : tensor<48xf32>
    %v10 = mapp.linear %v7, %v8, %v9 {mapp.name = "layers.0.attn.qkv"} : (tensor<2x8x16xf32>, tensor<48x16xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
    %v11 = mapp.slice %v10 {dim = 2 : i64, start = 0 : i64, end = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v12 = mapp.slice %v10 {dim = 2 : i64, start = 16 : i64, end = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v13 = mapp.slice %v10 {dim = 2 : i64, start = 32 : i64, end = 48 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v14 = mapp.attention %v11, %v12, %v13 {causal, heads = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v15 = mapp.param_ref @"layers.0.attn.proj.weight" : tensor<16x16xf32>
    %v16 = mapp.param_ref @"layers.0.attn.proj.bias" : tensor<16xf32>
    %v17 = mapp.linear %v14, %v15, %v16 {mapp.name = "layers.0.attn.out"} : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v18 = mapp.add %v4, %v17 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v19 = mapp.param_ref @"layers.0.ln2.weight" : tensor<16xf32>
    %v20 = mapp.param_ref @"layers.0.ln2.bias" : tensor<16xf32>
    %v21 = mapp.layer_norm %v18, %v19, %v20 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v22 = mapp.param_ref @"layers.0.mlp.fc1.weight" : tensor<64x16xf32>
    %v23 = mapp.param_ref @"layers.0.mlp.fc1.bias" : tensor<64xf32>
    %v24 = mapp.linear %v21, %v22, %v23 : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %v25 = mapp.gelu %v24 {approximate = "tanh"} : tensor<2x8x64xf32>
    %v26 = mapp.param_ref @"layers.0.mlp.fc2.weight" : tensor<16x64xf32>
    %v27 = mapp.param_ref @"layers.0.mlp.fc2.bias" : tensor<16xf32>
    %v28 = mapp.linear %v25, %v26, %v27 {mapp.name = "layers.0.mlp.out"} : (tensor<2x8x64xf32>, tensor<16x64xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v29 = mapp.add %v18, %v28 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v30 = mapp.param_ref @"ln_f.weight" : tensor<16xf32>
    %v31 = mapp.param_ref @"ln_f.bias" : tensor<16xf32>
    %v32 = mapp.layer_norm %v29, %v30, %v31 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v33 = mapp.linear %v32, %v1 {mapp.name = "logits"} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
    %v34 = mapp.cross_entropy %v33, %targets : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
    return %v34 : tensor<f32>
  }
}

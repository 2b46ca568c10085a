module attributes {mapp.model = {kind = "gpt", num_layers = 4 : i64, hidden_size = 16 : i64, num_attention_heads = 4 : i64, ffn_hidden_size = 64 : i64, vocab_size = 64 : i64, seq_length = 8 : i64}} {
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
  mapp.param @"layers.1.ln1.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.1.ln1.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.1.attn.qkv.weight" : tensor<48x16xf32>
  mapp.param @"layers.1.attn.qkv.bias" : tensor<48xf32> {init = "zeros"}
  mapp.param @"layers.1.attn.proj.weight" : tensor<16x16xf32>
  mapp.param @"layers.1.attn.proj.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.1.ln2.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.1.ln2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.1.mlp.fc1.weight" : tensor<64x16xf32>
  mapp.param @"layers.1.mlp.fc1.bias" : tensor<64xf32> {init = "zeros"}
  mapp.param @"layers.1.mlp.fc2.weight" : tensor<16x64xf32>
  mapp.param @"layers.1.mlp.fc2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.2.ln1.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.2.ln1.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.2.attn.qkv.weight" : tensor<48x16xf32>
  mapp.param @"layers.2.attn.qkv.bias" : tensor<48xf32> {init = "zeros"}
  mapp.param @"layers.2.attn.proj.weight" : tensor<16x16xf32>
  mapp.param @"layers.2.attn.proj.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.2.ln2.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.2.ln2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.2.mlp.fc1.weight" : tensor<64x16xf32>
  mapp.param @"layers.2.mlp.fc1.bias" : tensor<64xf32> {init = "zeros"}
  mapp.param @"layers.2.mlp.fc2.weight" : tensor<16x64xf32>
  mapp.param @"layers.2.mlp.fc2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.3.ln1.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.3.ln1.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.3.attn.qkv.weight" : tensor<48x16xf32>
  mapp.param @"layers.3.attn.qkv.bias" : tensor<48xf32> {init = "zeros"}
  mapp.param @"layers.3.attn.proj.weight" : tensor<16x16xf32>
  mapp.param @"layers.3.attn.proj.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.3.ln2.weight" : tensor<16xf32> {init = "ones"}
  mapp.param @"layers.3.ln2.bias" : tensor<16xf32> {init = "zeros"}
  mapp.param @"layers.3.mlp.fc1.weight" : tensor<64x16xf32>
  mapp.param @"layers.3.mlp.fc1.bias" : tensor<64xf32> {init = "zeros"}
  mapp.param @"layers.3.mlp.fc2.weight" : tensor<16x64xf32>
  mapp.param @"layers.3.mlp.fc2.bias" : tensor<16xf32> {init = "zeros"}
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
    %v30 = mapp.param_ref @"layers.1.ln1.weight" : tensor<16xf32>
    %v31 = mapp.param_ref @"layers.1.ln1.bias" : tensor<16xf32>
    %v32 = mapp.layer_norm %v29, %v30, %v31 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v33 = mapp.param_ref @"layers.1.attn.qkv.weight" : tensor<48x16xf32>
    %v34 = mapp.param_ref @"layers.1.attn.qkv.bias" : tensor<48xf32>
    %v35 = mapp.linear %v32, %v33, %v34 {mapp.name = "layers.1.attn.qkv"} : (tensor<2x8x16xf32>, tensor<48x16xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
    %v36 = mapp.slice %v35 {dim = 2 : i64, start = 0 : i64, end = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v37 = mapp.slice %v35 {dim = 2 : i64, start = 16 : i64, end = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v38 = mapp.slice %v35 {dim = 2 : i64, start = 32 : i64, end = 48 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v39 = mapp.attention %v36, %v37, %v38 {causal, heads = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v40 = mapp.param_ref @"layers.1.attn.proj.weight" : tensor<16x16xf32>
    %v41 = mapp.param_ref @"layers.1.attn.proj.bias" : tensor<16xf32>
    %v42 = mapp.linear %v39, %v40, %v41 {mapp.name = "layers.1.attn.out"} : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v43 = mapp.add %v29, %v42 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v44 = mapp.param_ref @"layers.1.ln2.weight" : tensor<16xf32>
    %v45 = mapp.param_ref @"layers.1.ln2.bias" : tensor<16xf32>
    %v46 = mapp.layer_norm %v43, %v44, %v45 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v47 = mapp.param_ref @"layers.1.mlp.fc1.weight" : tensor<64x16xf32>
    %v48 = mapp.param_ref @"layers.1.mlp.fc1.bias" : tensor<64xf32>
    %v49 = mapp.linear %v46, %v47, %v48 : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %v50 = mapp.gelu %v49 {approximate = "tanh"} : tensor<2x8x64xf32>
    %v51 = mapp.param_ref @"layers.1.mlp.fc2.weight" : tensor<16x64xf32>
    %v52 = mapp.param_ref @"layers.1.mlp.fc2.bias" : tensor<16xf32>
    %v53 = mapp.linear %v50, %v51, %v52 {mapp.name = "layers.1.mlp.out"} : (tensor<2x8x64xf32>, tensor<16x64xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v54 = mapp.add %v43, %v53 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v55 = mapp.param_ref @"layers.2.ln1.weight" : tensor<16xf32>
    %v56 = mapp.param_ref @"layers.2.ln1.bias" : tensor<16xf32>
    %v57 = mapp.layer_norm %v54, %v55, %v56 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v58 = mapp.param_ref @"layers.2.attn.qkv.weight" : tensor<48x16xf32>
    %v59 = mapp.param_ref @"layers.2.attn.qkv.bias" : tensor<48xf32>
    %v60 = mapp.linear %v57, %v58, %v59 {mapp.name = "layers.2.attn.qkv"} : (tensor<2x8x16xf32>, tensor<48x16xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
    %v61 = mapp.slice %v60 {dim = 2 : i64, start = 0 : i64, end = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v62 = mapp.slice %v60 {dim = 2 : i64, start = 16 : i64, end = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v63 = mapp.slice %v60 {dim = 2 : i64, start = 32 : i64, end = 48 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v64 = mapp.attention %v61, %v62, %v63 {causal, heads = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v65 = mapp.param_ref @"layers.2.attn.proj.weight" : tensor<16x16xf32>
    %v66 = mapp.param_ref @"layers.2.attn.proj.bias" : tensor<16xf32>
    %v67 = mapp.linear %v64, %v65, %v66 {mapp.name = "layers.2.attn.out"} : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v68 = mapp.add %v54, %v67 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v69 = mapp.param_ref @"layers.2.ln2.weight" : tensor<16xf32>
    %v70 = mapp.param_ref @"layers.2.ln2.bias" : tensor<16xf32>
    %v71 = mapp.layer_norm %v68, %v69, %v70 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v72 = mapp.param_ref @"layers.2.mlp.fc1.weight" : tensor<64x16xf32>
    %v73 = mapp.param_ref @"layers.2.mlp.fc1.bias" : tensor<64xf32>
    %v74 = mapp.linear %v71, %v72, %v73 : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %v75 = mapp.gelu %v74 {approximate = "tanh"} : tensor<2x8x64xf32>
    %v76 = mapp.param_ref @"layers.2.mlp.fc2.weight" : tensor<16x64xf32>
    %v77 = mapp.param_ref @"layers.2.mlp.fc2.bias" : tensor<16xf32>
    %v78 = mapp.linear %v75, %v76, %v77 {mapp.name = "layers.2.mlp.out"} : (tensor<2x8x64xf32>, tensor<16x64xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v79 = mapp.add %v68, %v78 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v80 = mapp.param_ref @"layers.3.ln1.weight" : tensor<16xf32>
    %v81 = mapp.param_ref @"layers.3.ln1.bias" : tensor<16xf32>
    %v82 = mapp.layer_norm %v79, %v80, %v81 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v83 = mapp.param_ref @"layers.3.attn.qkv.weight" : tensor<48x16xf32>
    %v84 = mapp.param_ref @"layers.3.attn.qkv.bias" : tensor<48xf32>
    %v85 = mapp.linear %v82, %v83, %v84 {mapp.name = "layers.3.attn.qkv"} : (tensor<2x8x16xf32>, tensor<48x16xf32>, tensor<48xf32>) -> tensor<2x8x48xf32>
    %v86 = mapp.slice %v85 {dim = 2 : i64, start = 0 : i64, end = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v87 = mapp.slice %v85 {dim = 2 : i64, start = 16 : i64, end = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v88 = mapp.slice %v85 {dim = 2 : i64, start = 32 : i64, end = 48 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
    %v89 = mapp.attention %v86, %v87, %v88 {causal, heads = 4 : i64, scale = 5.000000e-01 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v90 = mapp.param_ref @"layers.3.attn.proj.weight" : tensor<16x16xf32>
    %v91 = mapp.param_ref @"layers.3.attn.proj.bias" : tensor<16xf32>
    %v92 = mapp.linear %v89, %v90, %v91 {mapp.name = "layers.3.attn.out"} : (tensor<2x8x16xf32>, tensor<16x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v93 = mapp.add %v79, %v92 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v94 = mapp.param_ref @"layers.3.ln2.weight" : tensor<16xf32>
    %v95 = mapp.param_ref @"layers.3.ln2.bias" : tensor<16xf32>
    %v96 = mapp.layer_norm %v93, %v94, %v95 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v97 = mapp.param_ref @"layers.3.mlp.fc1.weight" : tensor<64x16xf32>
    %v98 = mapp.param_ref @"layers.3.mlp.fc1.bias" : tensor<64xf32>
    %v99 = mapp.linear %v96, %v97, %v98 : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
    %v100 = mapp.gelu %v99 {approximate = "tanh"} : tensor<2x8x64xf32>
    %v101 = mapp.param_ref @"layers.3.mlp.fc2.weight" : tensor<16x64xf32>
    %v102 = mapp.param_ref @"layers.3.mlp.fc2.bias" : tensor<16xf32>
    %v103 = mapp.linear %v100, %v101, %v102 {mapp.name = "layers.3.mlp.out"} : (tensor<2x8x64xf32>, tensor<16x64xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v104 = mapp.add %v93, %v103 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
    %v105 = mapp.param_ref @"ln_f.weight" : tensor<16xf32>
    %v106 = mapp.param_ref @"ln_f.bias" : tensor<16xf32>
    %v107 = mapp.layer_norm %v104, %v105, %v106 : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
    %v108 = mapp.linear %v107, %v1 {mapp.name = "logits"} : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
    %v109 = mapp.cross_entropy %v108, %targets : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
    return %v109 : tensor<f32>
  }
}

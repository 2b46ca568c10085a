// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 pp=2 microbatches=2 fbd=true fwd-tp=1 transfer=recompute fwd-device=cuda fwd-index=1" 2>/dev/null | FileCheck %s --check-prefix=RECOMP
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 pp=2 microbatches=2" -o %t.mlir
// RUN: mapp-opt %t.mlir --mapp-split-fwd-bwd="transfer=activations bwd-device=cuda" | FileCheck %s --check-prefix=ACT

// Recompute, fwd-tp 1 under bwd-tp 2: the backward side's stage 1 re-runs
// its forward on the input the forward rank sends, and sends nothing on.
// RECOMP: module attributes {mapp.fbd = {bwd_device = "cpu", bwd_index = 0 : i64, bwd_ranks = 4 : i64, bwd_tp = 2 : i64, fwd_device = "cuda", fwd_index = 1 : i64, fwd_ranks = 2 : i64, fwd_tp = 1 : i64, transfer = "recompute"}
// RECOMP-NOT: mapp.fbd_source
// RECOMP: func.func @forward_s0_c0(
// RECOMP-NOT: mapp.send
// RECOMP: func.func @forward_s1_c0(
// RECOMP-NEXT: mapp.recv from 0 tag 1000 {fbd_cross = "fwd"} : tensor<2x8x16xf32>
// RECOMP: func.func @backward_s1_c0(
// RECOMP: mapp.send {{.*}} to 0 tag 1 : tensor<2x8x16xf32>
// The forward side: its own module per stage, parameters unsharded at tp 1.
// RECOMP: mapp.subgraph @fbd_forward_s0 "forward" stage 0 at <rank = 4, device = "gpu", index = 1, tp = 1, dp = 1, pp = 2> {
// RECOMP: mapp.parallel = {chunks = 1 : i64, dp = 1 : i64, microbatches = 2 : i64, pp = 2 : i64, schedule = "1f1b", tp = 1 : i64}
// RECOMP: mapp.param @layers.0.attn.qkv.weight : tensor<48x16xf32>
// RECOMP: func.func @forward_s0_c0(%arg0: tensor<2x8xi32> {mapp.input = "tokens"}) attributes {mapp.chunk = 0 : i64, mapp.phase = "forward", mapp.stage = 0 : i64} {
// RECOMP: mapp.send {{.*}} to 1 tag 0 : tensor<2x8x16xf32>
// RECOMP: mapp.subgraph @fbd_backward_s0 "backward" stage 0 at <rank = 0, device = "cpu", index = 0, tp = 2, dp = 1, pp = 2> {
// Forward rank 0 of stage 1 sends the stage input to backward ranks 0 and 1.
// RECOMP: mapp.subgraph @fbd_forward_s1 "forward" stage 1 at <rank = 5, device = "gpu", index = 1, tp = 1, dp = 1, pp = 2> {
// RECOMP: %[[IN:.*]] = mapp.recv from 0 tag 0 : tensor<2x8x16xf32>
// RECOMP-NEXT: mapp.send %[[IN]] to 1 tag 1000 {fbd_cross = "bwd", fbd_q = 0 : i64}
// RECOMP-NEXT: mapp.send %[[IN]] to 1 tag 1000 {fbd_cross = "bwd", fbd_q = 1 : i64}
// RECOMP: return
// RECOMP-NEXT: }
// RECOMP: mapp.subgraph @fbd_backward_s1 "backward" stage 1 at <rank = 2, device = "cpu", index = 0, tp = 2, dp = 1, pp = 2> {

// Activations: the backward side's forward blocks only receive; the loss
// comes first on the last stage, block arguments (targets) are not sent.
// ACT: func.func @forward_s0_c0(
// ACT-NEXT: mapp.recv from 0 tag 1000 {fbd_cross = "fwd"} : tensor<2x8x32xf32>
// ACT-NOT: mapp.attention
// ACT: func.func @forward_s1_c0(%arg0: tensor<2x8xi32> {mapp.input = "targets"})
// ACT-NEXT: mapp.recv from 1 tag 1000 {fbd_cross = "fwd"} : tensor<f32>
// ACT-NEXT: mapp.recv from 1 tag 1001 {fbd_cross = "fwd"} : tensor<2x8x2xf32>
// ACT-NEXT: mapp.recv from 1 tag 1003 {fbd_cross = "fwd"}
// ACT: return %{{.*}}, %{{.*}}, %arg0,
// ACT: func.func @backward_s1_c0(
// ACT: mapp.subgraph @fbd_forward_s0 "forward" stage 0 at <rank = 4, device = "cpu", index = 0, tp = 2, dp = 1, pp = 2> {
// ACT: mapp.param @layers.0.attn.qkv.weight : tensor<24x16xf32> {shard_blocks = 3 : i64, shard_dim = 0 : i64, shard_group = "tp"}
// ACT: mapp.send {{.*}} to 0 tag 1000 {fbd_cross = "bwd", fbd_q = 0 : i64} : tensor<2x8x32xf32>
// ACT: mapp.subgraph @fbd_backward_s0 "backward" stage 0 at <rank = 0, device = "gpu", index = 0, tp = 2, dp = 1, pp = 2> {
// ACT: mapp.subgraph @fbd_forward_s1 "forward" stage 1 at <rank = 6, device = "cpu"
// ACT: mapp.ce_from_partials
// ACT: mapp.send {{.*}} to 1 tag 1000 {fbd_cross = "bwd", fbd_q = 0 : i64} : tensor<f32>

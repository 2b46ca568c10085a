// transfer=activations between degrees: the forward side (fwd-tp=1) slices
// each tp-sharded saved activation for the backward rank that holds that
// piece (fbd_from = the forward tp index that sends, fbd_to = the backward
// tp index), the backward side (tp=2) receives it (fbd_src per backward tp
// index) and recomputes only what TP built differently (vocab-parallel
// cross-entropy from the received logits shard).
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 fbd=true fwd-tp=1 transfer=activations" | FileCheck %s
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=1 fbd=true fwd-tp=2 transfer=activations" | FileCheck %s --check-prefix=CONCAT

// CHECK-LABEL: func.func @train_forward
// CHECK: mapp.recv from 0 tag {{[0-9]+}} {fbd_cross = "fwd", fbd_src = array<i64: 0, 0>}
// CHECK: mapp.vocab_ce_partials
// CHECK: mapp.ce_from_partials
// CHECK: mapp.subgraph @fbd_forward_s0
// CHECK: mapp.slice {{.*}}fbd_cross = "bwd", fbd_from = 0 : i64
// CHECK: mapp.send {{.*}}fbd_cross = "bwd", fbd_from = 0 : i64, fbd_to = 1 : i64

// CONCAT-LABEL: func.func @train_forward
// CONCAT: mapp.recv {{.*}}fbd_src = array<i64: 1>
// CONCAT-NEXT: mapp.concat {{.*}} {dim = 2 : i64}
// CONCAT: mapp.cross_entropy
// CONCAT: mapp.subgraph @fbd_forward_s0
// CONCAT: mapp.send {{.*}}fbd_from = 1 : i64, fbd_to = 0 : i64

// Uneven pipeline stages (docs/elastic.md, "Re-partitioning pipeline stages").
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-layers=1,3" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=LAYERS
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-layers=1,3" -mapp-autodiff 2>/dev/null | mapp-opt -verify-each | FileCheck %s --check-prefix=IR
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=3,1" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=SLOW0
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=1,3" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=SLOW1
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=1,1" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=EVEN
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 chunks=2 stage-layers=1,1,1,1" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=INTER
// RUN: mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 microbatches=2 stage-layers=3,1" -mlir-print-op-on-diagnostic=false 2>&1 -o /dev/null | FileCheck %s --check-prefix=TRAIN
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-layers=1,2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=SUM
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-layers=4" -o /dev/null 2>&1 | FileCheck %s --check-prefix=COUNT
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-layers=0,4" -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=1" -o /dev/null 2>&1 | FileCheck %s --check-prefix=WCOUNT
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=1,-2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=WNEG
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir -mapp-pipeline-partition="pp=2 stage-weights=1,2 stage-layers=2,2" -o /dev/null 2>&1 | FileCheck %s --check-prefix=BOTH

// Four GPT layers, 1 | 3 as asked (the even cut is 2 | 2: pipeline-partition.mlir).
// LAYERS: remark: pipeline partition into 2 stage(s) x 1 chunk(s): [stage 0 chunk 0: layers 0-0, {{[0-9]+}} FLOPs] [stage 1 chunk 0: layers 1-3, {{[0-9]+}} FLOPs]
// IR-LABEL: func.func @forward_s0_c0
// IR: mapp.param_ref @layers.0.
// IR-NOT: @layers.1.
// IR: mapp.send
// IR-LABEL: func.func @forward_s1_c0
// IR: mapp.param_ref @layers.1.
// IR: mapp.param_ref @layers.3.

// Stage 0 three times as slow per FLOP: it keeps one layer; stage 1 slow:
// it keeps the last layer (with the head and loss) only.
// (3 x 118400 = 355200 < 394368 beats 3 x 236544 for 0 | 0-3 ... cuts;
// 3 x 158080 = 474240 against 354688 beats 3 x 276224 for 2 | 2.)
// SLOW0: [stage 0 chunk 0: layers 0-0, 118400 FLOPs] [stage 1 chunk 0: layers 1-3, 394368 FLOPs]; per-stage weighted FLOPs 355200 394368;
// SLOW1: [stage 0 chunk 0: layers 0-2, 354688 FLOPs] [stage 1 chunk 0: layers 3-3, 158080 FLOPs]; per-stage weighted FLOPs 354688 474240;
// Equal weights: the even partition and its costs.
// EVEN: [stage 0 chunk 0: layers 0-1, 236544 FLOPs] [stage 1 chunk 0: layers 2-3, 276224 FLOPs]; per-stage weighted FLOPs 236544 276224
// INTER: [stage 0 chunk 0: layers 0-0, {{[0-9]+}} FLOPs] [stage 1 chunk 0: layers 1-1, {{[0-9]+}} FLOPs] [stage 0 chunk 1: layers 2-2, {{[0-9]+}} FLOPs] [stage 1 chunk 1: layers 3-3, {{[0-9]+}} FLOPs]
// TRAIN: [stage 0 chunk 0: layers 0-2, {{[0-9]+}} FLOPs] [stage 1 chunk 0: layers 3-3, {{[0-9]+}} FLOPs]

// SUM: error: mapp-pipeline-partition: stage-layers sums to 3 layers, the model has 4
// COUNT: error: mapp-pipeline-partition: stage-layers has 1 entries, pp=2 x chunks=1 needs 2
// ZERO: error: mapp-pipeline-partition: stage-layers entry 0 is 0, every stage needs a layer
// WCOUNT: error: mapp-pipeline-partition: stage-weights has 1 entries, pp=2 needs one per pipeline stage
// WNEG: error: mapp-pipeline-partition: stage-weights entry 1 is -2, must be a finite number > 0
// BOTH: error: mapp-pipeline-partition: give stage-layers or stage-weights, not both

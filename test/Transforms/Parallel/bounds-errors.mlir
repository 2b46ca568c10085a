// Issue 43, defect 9: parallel degrees, chunks and microbatches are bounded
// (mapp/rt/PlanLimits.h, the runtime's limits) with a located error before
// anything sized by them is built; microbatches=10^9 ran mapp-opt out of
// memory after two minutes.
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 microbatches=1000000000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=MB
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-pipeline-schedule="pp=64 microbatches=100000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=SLOTS
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-tensor-parallel="tp=100000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=TP
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-pipeline-partition="pp=100000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=PP
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-pipeline-partition="pp=2 chunks=5000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-expert-parallel="ep=100000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=EP
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="dp=100000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=DP
// RUN: not mapp-opt %S/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 dp=40000" -o /dev/null 2>&1 | FileCheck %s --check-prefix=WORLD
// The degrees of hand-written IR, at the plan lowering.
// RUN: not mapp-translate --mapp-to-plan %s -o /dev/null 2>&1 | FileCheck %s --check-prefix=IR

// MB: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-pipeline-schedule: microbatches=1000000000 is more than 1048576 (the most a plan may have)
// SLOTS: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-pipeline-schedule: stages x chunks x microbatches = 6400000 is more than 4194304 (the task tables hold two tasks for each)
// TP: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-tensor-parallel: tp=100000 is more than 65536 (the most ranks a plan may have)
// PP: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-pipeline-partition: pp=100000 is more than 65536 (the most ranks a plan may have)
// CHUNKS: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-pipeline-partition: chunks=5000 is more than 1024
// EP: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-expert-parallel: ep=100000 is more than 65536
// DP: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-data-parallel: dp=100000 is more than 65536
// WORLD: gpt-4l.mlir:[[#]]:[[#]]: error: mapp-data-parallel: world size tp*pp*dp=80000 is more than 65536
// IR: bounds-errors.mlir:[[#]]:[[#]]: error: mapp.parallel tp x pp x dp = 1 x 1 x 70000 is more than 65536 ranks
module attributes {mapp.parallel = {dp = 70000 : i64}} {
}

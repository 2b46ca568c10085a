// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=6 chunks=2" -verify-diagnostics
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=zb microbatches=4" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 chunks=2" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 pp=2" 2>&1 | FileCheck %s --check-prefix=DISAGREE

// expected-error @+1 {{mapp-pipeline-schedule: interleaved schedule needs microbatches (6) to be a multiple of the pipeline stages (4)}}
module attributes {mapp.parallel = {pp = 4 : i64}} {
}

// UNKNOWN: error: mapp-pipeline-schedule: unknown schedule 'zb' (expected gpipe, 1f1b or interleaved)
// CHUNKS: error: mapp-pipeline-schedule: schedule '1f1b' runs one chunk per stage, got chunks=2 (use interleaved)
// DISAGREE: error: mapp-pipeline-schedule: pp=2 chunks=1 disagree with the partition (pp=4, chunks=1)

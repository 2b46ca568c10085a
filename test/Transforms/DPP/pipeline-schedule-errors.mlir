// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=6 chunks=2" -verify-diagnostics
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=zb microbatches=4" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 chunks=2" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 pp=2" 2>&1 | FileCheck %s --check-prefix=DISAGREE

// Infeasible MegaDPP schedules name the constraint they break.
// RUN: echo 'module attributes {mapp.parallel = {pp = 2 : i64, chunks = 2 : i64}} {}' > %t.mlir
// Group N outside [p, m].
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=interleaved group=5 microbatches=4" 2>&1 | FileCheck %s --check-prefix=GROUP-HI
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=interleaved group=1 microbatches=4" 2>&1 | FileCheck %s --check-prefix=GROUP-LO
// A microbatch count the schedule cannot take.
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=interleaved group=4 microbatches=6" 2>&1 | FileCheck %s --check-prefix=GROUP-DIV
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=dfc microbatches=5" 2>&1 | FileCheck %s --check-prefix=DFC-DIV
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=bfc microbatches=1" 2>&1 | FileCheck %s --check-prefix=BFC-FEW
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=adaptive microbatches=3" 2>&1 | FileCheck %s --check-prefix=ADAPTIVE-DIV
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=zb-h1 microbatches=4" 2>&1 | FileCheck %s --check-prefix=ZB-CHUNKS
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=dfc group=4 microbatches=4" 2>&1 | FileCheck %s --check-prefix=DFC-GROUP
// Options that do not apply, or nonsensical policy values.
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b group=2 microbatches=4 pp=4" 2>&1 | FileCheck %s --check-prefix=GROUP-1F1B
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=dfc microbatches=4 mem-cap=1G" 2>&1 | FileCheck %s --check-prefix=CAP-STATIC
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=adaptive microbatches=4 mem-cap=lots" 2>&1 | FileCheck %s --check-prefix=CAP-BAD
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=adaptive microbatches=4 slow-link-ratio=0.5" 2>&1 | FileCheck %s --check-prefix=RATIO
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=adaptive microbatches=4 bandwidth-smoothing=2" 2>&1 | FileCheck %s --check-prefix=SMOOTH
// RUN: not mapp-opt %t.mlir -mapp-pipeline-schedule="schedule=adaptive microbatches=4 group=2" 2>&1 | FileCheck %s --check-prefix=ADAPTIVE-GROUP

// expected-error @+1 {{mapp-pipeline-schedule: schedule 'interleaved' needs microbatches (6) to be a multiple of its group N = 4 (= p)}}
module attributes {mapp.parallel = {pp = 4 : i64}} {
}

// UNKNOWN: error: mapp-pipeline-schedule: unknown schedule 'zb' (expected gpipe, 1f1b, interleaved, dfc, bfc, zb-h1 or adaptive)
// CHUNKS: error: mapp-pipeline-schedule: schedule '1f1b' runs one chunk per stage, got chunks=2 (use interleaved, dfc or bfc)
// DISAGREE: error: mapp-pipeline-schedule: pp=2 chunks=1 disagree with the partition (pp=4, chunks=1)
// GROUP-HI: error: mapp-pipeline-schedule: interleaved group=5 is outside [p, m] = [2, 4]
// GROUP-LO: error: mapp-pipeline-schedule: interleaved group=1 is outside [p, m] = [2, 4]
// GROUP-DIV: error: mapp-pipeline-schedule: schedule 'interleaved' needs microbatches (6) to be a multiple of its group N = 4{{$}}
// DFC-DIV: error: mapp-pipeline-schedule: schedule 'dfc' needs microbatches (5) to be a multiple of its group N = 2 (= p)
// BFC-FEW: error: mapp-pipeline-schedule: schedule 'bfc' with 2 chunks needs at least as many microbatches (1) as pipeline stages (2)
// ADAPTIVE-DIV: error: mapp-pipeline-schedule: schedule 'dfc' needs microbatches (3) to be a multiple of its group N = 2 (= p)
// ZB-CHUNKS: error: mapp-pipeline-schedule: schedule 'zb-h1' runs one chunk per stage, got chunks=2 (use interleaved, dfc or bfc)
// DFC-GROUP: error: mapp-pipeline-schedule: dfc is group=p (2), got group=4
// GROUP-1F1B: error: mapp-pipeline-schedule: group=2 applies to interleaved schedules, not '1f1b'
// CAP-STATIC: error: mapp-pipeline-schedule: mem-cap applies to schedule=adaptive, not 'dfc'
// CAP-BAD: error: mapp-pipeline-schedule: mem-cap='lots' is not a byte count (e.g. 1073741824, 512MiB, 2G)
// RATIO: error: mapp-pipeline-schedule: slow-link-ratio must be > 1 (a link is slow when its bandwidth is this many times below its best), got 0.500000
// SMOOTH: error: mapp-pipeline-schedule: bandwidth-smoothing must be in (0, 1], got 2.000000
// ADAPTIVE-GROUP: error: mapp-pipeline-schedule: group= does not apply to schedule=adaptive (its tables are dfc and bfc)

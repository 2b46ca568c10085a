// Closed-form facts of the generated schedules, checked by simulating them
// with unit-cost forwards and double-cost backwards (F = 1, B = 2 per
// chunk). For GPipe and 1F1B the step takes (m + p − 1)(F + B) and the
// bubble fraction is (p − 1)/(m + p − 1); interleaving over v chunks cuts
// it to (p − 1)/(v·m + p − 1) (ANCHORS.md: (p − 1)/m of the ideal time,
// (p − 1)/(v·m) interleaved). 1F1B stage s runs min(p − s − 1, m) warm-up
// forwards before its steady state, so it has run min(p − s, m) forwards
// when its first backward starts, and that is also its peak of microbatches
// in flight: p on stage 0 (GPipe: all m).

// p = 4, m = 8: 3·11 = 33, bubble 3/11.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=8 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=P4M8
// P4M8: remark: schedule 1f1b: 4 stage(s) x 1 chunk(s), 8 microbatch(es): makespan 33, bubble 0.2727;
// P4M8-SAME: rank 0: F before first B 4, peak in flight 4, bubble 0.2727; rank 1: F before first B 3, peak in flight 3, bubble 0.2727;
// P4M8-SAME: rank 2: F before first B 2, peak in flight 2, bubble 0.2727; rank 3: F before first B 1, peak in flight 1, bubble 0.2727

// GPipe has the same bubble but holds all m microbatches.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=gpipe microbatches=8 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=GPIPE
// GPIPE: makespan 33, bubble 0.2727; rank 0: F before first B 8, peak in flight 8

// p = 8, m = 16: 3·23 = 69, bubble 7/23.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=16 pp=8" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=P8
// P8: makespan 69, bubble 0.3043; rank 0: F before first B 8, peak in flight 8,
// P8-SAME: rank 5: F before first B 3, peak in flight 3,
// P8-SAME: rank 7: F before first B 1, peak in flight 1,

// Fewer microbatches than stages: p = 4, m = 2: 3·5 = 15, bubble 3/5,
// warm-up capped at m.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=FEW
// FEW: makespan 15, bubble 0.6000; rank 0: F before first B 2, peak in flight 2, bubble 0.6000; rank 1: F before first B 2

// Interleaved, p = 4, v = 2, m = 8: 3·(16 + 3) = 57, bubble 3/19.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=8 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=V2
// V2: schedule interleaved: 4 stage(s) x 2 chunk(s), 8 microbatch(es): makespan 57, bubble 0.1579;
// Warm-up (p − r − 1)·2 + (v − 1)·p, plus the first steady forward.
// V2-SAME: rank 0: F before first B 11, peak in flight 11, bubble 0.1579; rank 1: F before first B 9

// Interleaved, p = 4, v = 4, m = 8: 3·(32 + 3) = 105, bubble 3/35.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=8 pp=4 chunks=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=V4
// V4: makespan 105, bubble 0.0857

// m = p: the warm-up of the first ranks covers every forward; 3·(8 + 3) = 33,
// bubble 3/11.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=4 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=MEQP
// MEQP: makespan 33, bubble 0.2727; rank 0: F before first B 8, peak in flight 8, bubble 0.2727; rank 1: F before first B 8, peak in flight 8, bubble 0.2727; rank 2: F before first B 7, peak in flight 7, bubble 0.2727; rank 3: F before first B 5

// Other costs: F = 1, B = 1, p = 2, m = 2: (2 + 1)·2 = 6, bubble 1/3.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=2" -mapp-verify-schedule="report=true backward-cost=1" -o /dev/null 2>&1 | FileCheck %s --check-prefix=UNIT
// UNIT: makespan 6, bubble 0.3333

// Interleaved with microbatch group N: rank r warms up with
// 2(p − r − 1) + (v − 1)·N forwards (capped at v·m); the step stays
// (v·m + p − 1)(F + B) for every N dividing m. p = 4, v = 2, m = 8, N = 8
// (bfc): 14, 12, 10, 8 warm-up forwards, 57 = 3·19, bubble 3/19 on every
// rank.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=bfc microbatches=8 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=BFC
// BFC: schedule bfc: 4 stage(s) x 2 chunk(s), 8 microbatch(es): makespan 57, bubble 0.1579;
// BFC-SAME: rank 0: F before first B 15, peak in flight 15, bubble 0.1579; rank 1: F before first B 13, peak in flight 13, bubble 0.1579;
// BFC-SAME: rank 2: F before first B 11, peak in flight 11, bubble 0.1579; rank 3: F before first B 9, peak in flight 9, bubble 0.1579
// p = 4, v = 4, m = 8, N = 8: 6 + 24 = 30 on rank 0, 24 on rank 3;
// 3·(32 + 3) = 105.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved group=8 microbatches=8 pp=4 chunks=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=G8V4
// G8V4: makespan 105, bubble 0.0857; rank 0: F before first B 31, peak in flight 31, bubble 0.0857;
// G8V4-SAME: rank 3: F before first B 25, peak in flight 25, bubble 0.0857
// N = 4 with m = 8, v = 2, p = 2: 2 + 4 = 6 and 4 warm-up forwards.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved group=4 microbatches=8 pp=2 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=G4
// G4: makespan 51, bubble 0.0588; rank 0: F before first B 7, peak in flight 7, bubble 0.0588; rank 1: F before first B 5, peak in flight 5, bubble 0.0588

// Adaptive: both tables are checked and reported.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=adaptive microbatches=8 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=ADAPTIVE
// ADAPTIVE: remark: schedule dfc: {{.*}}makespan 57, bubble 0.1579; rank 0: F before first B 11,
// ADAPTIVE: remark: schedule bfc: {{.*}}makespan 57, bubble 0.1579; rank 0: F before first B 15,

// ZB-H1: with the backward split into Bi and W, the bubble is
// (p − 1)(F + Bi − W) per rank: p = 4, m = 8, F = Bi = W = 1:
// 8·3 + 3·1 = 27, bubble 3/27 (1F1B with B = 2: 33); at most p = 4 in
// flight on every rank (1F1B's rank-0 peak).
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=zb-h1 microbatches=8 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZB
// ZB: schedule zb-h1: 4 stage(s) x 1 chunk(s), 8 microbatch(es): makespan 27, bubble 0.1111;
// ZB-SAME: rank 0: F before first B 4, peak in flight 4, bubble 0.1111; rank 1: F before first B 3, peak in flight 4, bubble 0.1111;
// ZB-SAME: rank 2: F before first B 2, peak in flight 4, bubble 0.1111; rank 3: F before first B 1, peak in flight 4, bubble 0.1111
// F = 2, Bi = 2, W = 1: 8·5 + 3·3 = 49, bubble 9/49.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=zb-h1 microbatches=8 pp=4" -mapp-verify-schedule="report=true forward-cost=2 backward-input-cost=2 backward-weight-cost=1" -o /dev/null 2>&1 | FileCheck %s --check-prefix=ZB2
// ZB2: makespan 49, bubble 0.1837; rank 0: {{.*}} bubble 0.1837; rank 1:

// Costs from the IR's cost model (cost-model=true): B/F from the FLOPs of
// the GPT's backward and forward functions (about 2); the 1F1B bubble
// (p − 1)/(m + p − 1) = 1/5 does not depend on them.
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 microbatches=4" 2>/dev/null | mapp-opt -mapp-verify-schedule="report=true cost-model=true" -o /dev/null 2>&1 | FileCheck %s --check-prefix=IRCOST
// IRCOST: remark: costs from the IR (per chunk, F = 1): B 1.9{{[0-9]+}}, Bi 0.9{{[0-9]+}}, W 0.9{{[0-9]+}}; schedule 1f1b: {{.*}} bubble 0.2000; rank 0: F before first B 2, peak in flight 2, bubble 0.2000; rank 1: F before first B 1, peak in flight 1, bubble 0.2000
// RUN: not mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=2" -mapp-verify-schedule="cost-model=true" 2>&1 | FileCheck %s --check-prefix=NOCOST
// NOCOST: error: mapp-verify-schedule: cost-model=true needs forward functions with FLOPs (run --mapp-autodiff first)

// Without report the verifier is silent on a valid schedule.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=2" -mapp-verify-schedule 2>&1 | FileCheck %s --check-prefix=QUIET
// QUIET-NOT: remark
// QUIET: mapp.schedule "1f1b"

module {
}

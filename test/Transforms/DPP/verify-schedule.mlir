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
// P4M8-SAME: rank 0: F before first B 4, peak in flight 4; rank 1: F before first B 3, peak in flight 3;
// P4M8-SAME: rank 2: F before first B 2, peak in flight 2; rank 3: F before first B 1, peak in flight 1

// GPipe has the same bubble but holds all m microbatches.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=gpipe microbatches=8 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=GPIPE
// GPIPE: makespan 33, bubble 0.2727; rank 0: F before first B 8, peak in flight 8

// p = 8, m = 16: 3·23 = 69, bubble 7/23.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=16 pp=8" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=P8
// P8: makespan 69, bubble 0.3043; rank 0: F before first B 8, peak in flight 8;
// P8-SAME: rank 5: F before first B 3, peak in flight 3;
// P8-SAME: rank 7: F before first B 1, peak in flight 1

// Fewer microbatches than stages: p = 4, m = 2: 3·5 = 15, bubble 3/5,
// warm-up capped at m.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=FEW
// FEW: makespan 15, bubble 0.6000; rank 0: F before first B 2, peak in flight 2; rank 1: F before first B 2

// Interleaved, p = 4, v = 2, m = 8: 3·(16 + 3) = 57, bubble 3/19.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=8 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=V2
// V2: schedule interleaved: 4 stage(s) x 2 chunk(s), 8 microbatch(es): makespan 57, bubble 0.1579;
// Warm-up (p − r − 1)·2 + (v − 1)·p, plus the first steady forward.
// V2-SAME: rank 0: F before first B 11, peak in flight 11; rank 1: F before first B 9

// Interleaved, p = 4, v = 4, m = 8: 3·(32 + 3) = 105, bubble 3/35.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=8 pp=4 chunks=4" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=V4
// V4: makespan 105, bubble 0.0857

// m = p: the warm-up of the first ranks covers every forward; 3·(8 + 3) = 33,
// bubble 3/11.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=4 pp=4 chunks=2" -mapp-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=MEQP
// MEQP: makespan 33, bubble 0.2727; rank 0: F before first B 8, peak in flight 8; rank 1: F before first B 8, peak in flight 8; rank 2: F before first B 7, peak in flight 7; rank 3: F before first B 5

// Other costs: F = 1, B = 1, p = 2, m = 2: (2 + 1)·2 = 6, bubble 1/3.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=2" -mapp-verify-schedule="report=true backward-cost=1" -o /dev/null 2>&1 | FileCheck %s --check-prefix=UNIT
// UNIT: makespan 6, bubble 0.3333

// Without report the verifier is silent on a valid schedule.
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=2 pp=2" -mapp-verify-schedule 2>&1 | FileCheck %s --check-prefix=QUIET
// QUIET-NOT: remark
// QUIET: mapp.schedule "1f1b"

module {
}

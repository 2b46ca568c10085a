// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=gpipe microbatches=3 pp=2" | FileCheck %s --check-prefix=GPIPE
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 pp=3" | FileCheck %s --check-prefix=1F1B
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=1 pp=3" | FileCheck %s --check-prefix=FEW
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=INTER
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=2 pp=1" | FileCheck %s --check-prefix=ONE
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=dfc microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=DFC
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved group=2 microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=INTER
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=bfc microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=BFC
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved group=4 microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=GROUP4
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=zb-h1 microbatches=3 pp=2" | FileCheck %s --check-prefix=ZB
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=adaptive microbatches=4 pp=2 chunks=2 mem-cap=64MiB slow-link-ratio=2" | FileCheck %s --check-prefix=ADAPTIVE
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=adaptive microbatches=4 pp=2 chunks=2" | mapp-opt -mapp-pipeline-schedule="schedule=dfc microbatches=4" 2>&1 | FileCheck %s --check-prefix=REPLACED
// The module's partition (mapp.pp, mapp.chunks) supplies the degrees.
// RUN: echo 'module attributes {mapp.parallel = {pp = 2 : i64, chunks = 1 : i64}} {}' | mapp-opt -mapp-pipeline-schedule="schedule=1f1b microbatches=2" | FileCheck %s --check-prefix=ATTR

module {
  // An existing schedule is replaced.
  mapp.schedule "gpipe" {microbatches = 1 : i64, chunks = 1 : i64, tables = [[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>]]}
}

// GPIPE: mapp.schedule "gpipe" {chunks = 1 : i64, microbatches = 3 : i64, tables = {{\[}}
// GPIPE-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>],
// GPIPE-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>]]}
// GPIPE-NOT: mapp.schedule

// Stage s: min(p − s − 1, m) warm-up forwards, 1F1B steady state, cool-down.
// 1F1B: mapp.schedule "1f1b" {chunks = 1 : i64, microbatches = 4 : i64, tables = {{\[}}
// 1F1B-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 3>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>],
// 1F1B-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 1>, #mapp.task<F, 0, 3>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>],
// 1F1B-SAME: [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 2>, #mapp.task<F, 0, 3>, #mapp.task<B, 0, 3>]]}

// Fewer microbatches than warm-up slots: warm-up is capped at m.
// FEW: tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>], [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>], [#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>]]

// Megatron's interleaved order, p = 2, v = 2, m = 4: rank r warms up with
// (p − r − 1)·2 + (v − 1)·p forwards; forwards walk chunks in groups of p
// microbatches, backwards walk the chunks in reverse.
// INTER: mapp.schedule "interleaved" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}
// INTER-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 1, 0>, #mapp.task<F, 0, 3>, #mapp.task<B, 1, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 0, 0>, #mapp.task<F, 1, 3>, #mapp.task<B, 0, 1>, #mapp.task<B, 1, 2>, #mapp.task<B, 1, 3>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>],
// INTER-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 1, 0>, #mapp.task<B, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<B, 1, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 3>, #mapp.task<B, 0, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 1, 2>, #mapp.task<F, 1, 3>, #mapp.task<B, 1, 3>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>]]}

// One chunk per stage: interleaved is 1F1B.
// ONE: mapp.schedule "1f1b" {chunks = 1 : i64, microbatches = 2 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<B, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<B, 0, 1>]]}

// ATTR: module attributes {mapp.parallel = {chunks = 1 : i64, microbatches = 2 : i64, pp = 2 : i64, schedule = "1f1b"}}
// ATTR: mapp.schedule "1f1b" {chunks = 1 : i64, microbatches = 2 : i64, tables = {{\[}}[{{[^]]*}}], [{{[^]]*}}]]}

// Depth-first chunks (N = p) is Megatron's default interleaved order.
// DFC: mapp.schedule "dfc" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}
// DFC-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<F, 0, 2>, #mapp.task<B, 1, 0>, #mapp.task<F, 0, 3>, #mapp.task<B, 1, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 0, 0>, #mapp.task<F, 1, 3>, #mapp.task<B, 0, 1>, #mapp.task<B, 1, 2>, #mapp.task<B, 1, 3>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>],

// Breadth-first chunks (N = m = 4): every microbatch through chunk 0, then
// chunk 1; rank 0 warms up with 2(p − 1) + (v − 1)·m = 6 forwards, rank 1
// with 4.
// BFC: mapp.schedule "bfc" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}
// BFC-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<F, 0, 3>, #mapp.task<F, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 1, 0>, #mapp.task<F, 1, 3>, #mapp.task<B, 1, 1>, #mapp.task<B, 1, 2>, #mapp.task<B, 1, 3>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>],
// BFC-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<F, 0, 3>, #mapp.task<F, 1, 0>, #mapp.task<B, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<B, 1, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 1, 2>, #mapp.task<F, 1, 3>, #mapp.task<B, 1, 3>, #mapp.task<B, 0, 0>, #mapp.task<B, 0, 1>, #mapp.task<B, 0, 2>, #mapp.task<B, 0, 3>]]}
// GROUP4: mapp.schedule "interleaved" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>, #mapp.task<F, 0, 3>, #mapp.task<F, 1, 0>, #mapp.task<F, 1, 1>, #mapp.task<F, 1, 2>, #mapp.task<B, 1, 0>,

// ZB-H1, p = 2, m = 3: rank 0 runs each W right after its Bi; rank 1
// defers one W.
// ZB: mapp.schedule "zb-h1" {chunks = 1 : i64, microbatches = 3 : i64, tables = {{\[}}
// ZB-SAME: [#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<Bi, 0, 0>, #mapp.task<W, 0, 0>, #mapp.task<F, 0, 2>, #mapp.task<Bi, 0, 1>, #mapp.task<W, 0, 1>, #mapp.task<Bi, 0, 2>, #mapp.task<W, 0, 2>],
// ZB-SAME: [#mapp.task<F, 0, 0>, #mapp.task<Bi, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<Bi, 0, 1>, #mapp.task<W, 0, 0>, #mapp.task<F, 0, 2>, #mapp.task<Bi, 0, 2>, #mapp.task<W, 0, 1>, #mapp.task<W, 0, 2>]]}

// Adaptive: the policy, then the dfc table (the static fallback) and the
// bfc table.
// ADAPTIVE: module attributes {mapp.adaptive = {bandwidth_smoothing = 2.500000e-01 : f64, mem_cap_bytes = 67108864 : i64, slow_link_ratio = 2.000000e+00 : f64}, mapp.parallel = {microbatches = 4 : i64, schedule = "adaptive"}}
// ADAPTIVE: mapp.schedule "dfc" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 1, 0>,
// ADAPTIVE: mapp.schedule "bfc" {chunks = 2 : i64, microbatches = 4 : i64, tables = {{\[}}[#mapp.task<F, 0, 0>, #mapp.task<F, 0, 1>, #mapp.task<F, 0, 2>,
// ADAPTIVE-NOT: mapp.schedule

// A new schedule replaces both tables and the policy.
// REPLACED-NOT: mapp.adaptive
// REPLACED: mapp.schedule "dfc"
// REPLACED-NOT: mapp.schedule

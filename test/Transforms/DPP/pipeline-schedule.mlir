// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=gpipe microbatches=3 pp=2" | FileCheck %s --check-prefix=GPIPE
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=4 pp=3" | FileCheck %s --check-prefix=1F1B
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=1f1b microbatches=1 pp=3" | FileCheck %s --check-prefix=FEW
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=4 pp=2 chunks=2" | FileCheck %s --check-prefix=INTER
// RUN: mapp-opt %s -mapp-pipeline-schedule="schedule=interleaved microbatches=2 pp=1" | FileCheck %s --check-prefix=ONE
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

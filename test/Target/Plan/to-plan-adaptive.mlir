// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-opt %S/../../Transforms/Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 chunks=2 microbatches=4 schedule=adaptive mem-cap=1G slow-link-ratio=2" -mapp-plan-memory -mapp-lower-to-plan 2>%t/remarks | mapp-translate --mapp-to-plan -o %t/p.mplan
// RUN: flatc --json --raw-binary --strict-json --defaults-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/p.mplan
// RUN: FileCheck %s < %t/p.json
// RUN: FileCheck %s --check-prefix=MEM < %t/remarks
// A static schedule carries no tables and no policy, but its stash.
// RUN: mapp-opt %S/../../Transforms/Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 chunks=2 microbatches=4 schedule=dfc" -mapp-plan-memory -mapp-lower-to-plan 2>/dev/null | mapp-translate --mapp-to-plan -o %t/s.mplan
// RUN: flatc --json --raw-binary --strict-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/s.mplan
// RUN: FileCheck %s --check-prefix=STATIC < %t/s.json
// A cap below one microbatch is a located error.
// RUN: not mapp-opt %S/../../Transforms/Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 chunks=2 microbatches=4 schedule=adaptive mem-cap=64K" -mapp-plan-memory 2>&1 | FileCheck %s --check-prefix=CAP

// The adaptive plan: Plan.schedule, the policy from the options, and per
// program the dfc order as its tasks and both tables. Stage 0's first
// tasks: dfc runs F(chunk 0, mb 0), F(0, 1), F(1, 0) (blocks 0 and 1 are
// its chunk-0 and chunk-1 forwards); bfc runs chunk 0 for every
// microbatch first.
// CHECK: "schedule": "adaptive",
// CHECK: "programs": [
// CHECK: "rank": 0,
// CHECK: "tasks": [
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 0
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 1
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "block": 1,
// CHECK-NEXT: "microbatch": 0
// CHECK: "schedule_tables": [
// CHECK-NEXT: {
// CHECK-NEXT: "name": "dfc",
// CHECK: "name": "bfc",
// CHECK-NEXT: "tasks": [
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 0
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 1
// CHECK-NEXT: },
// CHECK-NEXT: {
// CHECK-NEXT: "block": 0,
// CHECK-NEXT: "microbatch": 2
// CHECK: "stash_bytes": [[STASH0:[1-9][0-9]*]]
// CHECK: "rank": 1,
// CHECK: "schedule_tables": [
// CHECK: "stash_bytes": {{[1-9][0-9]*}}
// CHECK: "adaptive": {
// CHECK-NEXT: "mem_cap_bytes": 1073741824,
// CHECK-NEXT: "slow_link_ratio": 2.0,
// CHECK-NEXT: "bandwidth_smoothing": 0.25
// CHECK-NEXT: }

// mapp-opt reports the peak memory per stage for the schedule: the slots
// cover bfc's widest span; stage 0 stashes 5 (chunk, microbatch)
// activations under dfc (2(p − 1) + (v − 1)·p warm-up + 1), 7 under bfc
// (2(p − 1) + (v − 1)·m + 1).
// MEM: remark: memory plan, stage 0: peak {{[0-9]+}} B {{.*}} + 4 slot(s) x arena {{.*}}; stash [[S:[0-9]+]] B per (chunk, microbatch); dfc: 5 in flight, {{[0-9]+}} B stashed; bfc: 7 in flight, {{[0-9]+}} B stashed
// MEM: remark: memory plan, stage 1: {{.*}}; dfc: 3 in flight, {{.*}}; bfc: 5 in flight,

// STATIC: "schedule": "dfc",
// STATIC-NOT: "schedule_tables"
// STATIC-NOT: "adaptive"
// STATIC: "stash_bytes": {{[1-9]}}
// STATIC-NOT: "schedule_tables"
// STATIC-NOT: "adaptive"

// CAP: error: adaptive schedule: mem-cap 65536 B is below what the dfc table needs on stage 0: persistent {{[0-9]+}} B + 4 arena slot(s) x {{[0-9]+}} B = {{[0-9]+}} B

// A cap between dfc's and bfc's needs shrinks the arena slots to what it
// holds (8 microbatches: bfc keeps all 8 alive, dfc 4 on stage 0 and 3 on
// stage 1): 133120 + 6 x 42496 = 388096 <= 400000 on stage 0, 133120 + 5 x
// 46848 on stage 1; the runtime's scheduler admits into free slots only.
// RUN: mapp-opt %S/../../Transforms/Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 chunks=2 microbatches=8 schedule=adaptive mem-cap=400000" -mapp-plan-memory -o /dev/null 2>&1 | FileCheck %s --check-prefix=SLOTS
// SLOTS: remark: memory plan, stage 0: peak 388096 B {{.*}} + 6 slot(s) x arena 42496 B
// SLOTS: remark: memory plan, stage 1: peak 367360 B {{.*}} + 5 slot(s) x arena 46848 B

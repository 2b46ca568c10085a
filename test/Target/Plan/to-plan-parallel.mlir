// RUN: rm -rf %t && mkdir -p %t
// RUN: mapp-opt %S/../../Transforms/Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 pp=2 dp=2 microbatches=2 zero1=true max-grad-norm=1.0" -mapp-plan-memory -mapp-lower-to-plan | mapp-translate --mapp-to-plan -o %t/p.mplan
// RUN: flatc --json --raw-binary --strict-json --defaults-json -o %t %mapp_src/runtime/schema/plan.fbs -- %t/p.mplan
// RUN: FileCheck %s < %t/p.json
// RUN: FileCheck %s --check-prefix=NORM < %t/p.json

// The parallel training step lowers: 8 programs in Megatron order.
// CHECK: "world_size": 8,
// CHECK: "tp": 2,
// CHECK-NEXT: "pp": 2,
// CHECK-NEXT: "dp": 2,
// CHECK: "num_microbatches": 2,
// CHECK: "max_grad_norm": 1.0,
// CHECK: "programs": [
// Program 0 = (tp 0, dp 0, pp 0). The vocab-parallel embedding is a
// tp-sharded Param holding its piece; the fused qkv is cut in 3 blocks.
// CHECK: "rank": 0,
// CHECK: "name": "wte.weight",
// CHECK-NEXT: "kind": "Param",
// CHECK: "shape": [
// CHECK-NEXT: 32,
// CHECK-NEXT: 16
// CHECK: "shard_dim": 0,
// CHECK-NEXT: "shard_group": "tp",
// CHECK-NEXT: "shard_blocks": 1
// CHECK: "name": "layers.0.attn.qkv.weight",
// CHECK-NEXT: "kind": "Param",
// CHECK: "shard_dim": 0,
// CHECK-NEXT: "shard_group": "tp",
// CHECK-NEXT: "shard_blocks": 3
// CHECK: "name": "layers.0.attn.proj.weight",
// CHECK-NEXT: "kind": "Param",
// CHECK: "shard_dim": 1,
// The embedding looks up the rank's vocabulary slice.
// CHECK: "kernel": "embedding",
// CHECK: "key": "group",
// CHECK: "s": "tp"
// The dp bucket: gradient buffers in and out (in place), ZeRO-1 mode.
// CHECK: "kernel": "grad_sync",
// CHECK: "key": "group",
// CHECK: "s": "dp"
// CHECK: "s": "reduce_scatter"
// The tied embedding's stage sum names global ranks: stage 0 and 1 at this
// rank's (dp 0, tp 0) are ranks 0 and 4.
// CHECK: "kernel": "grad_sync",
// CHECK-NEXT: "inputs": [
// CHECK-NEXT: 1
// CHECK-NEXT: ],
// CHECK-NEXT: "outputs": [
// CHECK-NEXT: 1
// CHECK: "key": "ranks",
// CHECK: "ints": [
// CHECK-NEXT: 0,
// CHECK-NEXT: 4
// CHECK: "s": "sum"
// ZeRO-sharded updates carry the rank's range of the parameter; the
// buckets' param_gathers follow.
// CHECK: "kind": "Optimizer",
// CHECK: "kernel": "adamw",
// CHECK: "key": "zero_begin",
// CHECK: "key": "zero_end",
// CHECK: "kernel": "param_gather",
// Program 5 = (tp 1, dp 0, pp 1): its tied sync pairs ranks 1 and 5.
// CHECK: "rank": 5,
// CHECK: "key": "ranks",
// CHECK: "ints": [
// CHECK-NEXT: 1,
// CHECK-NEXT: 5

// With several ranks the norm is the executor's world-wide one.
// NORM-NOT: "kernel": "global_norm"

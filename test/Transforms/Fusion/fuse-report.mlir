// RUN: mapp-opt %s -mapp-fuse -mapp-fuse-report -o /dev/null 2>&1 | FileCheck %s
// RUN: echo '{"device": "cpu", "gemm_tflops": {"f32": 1}, "mem_gbps": 100, "op_overhead_us": 2}' > %t.json
// RUN: mapp-opt %s -mapp-fuse -mapp-fuse-report=profile=%t.json -o /dev/null 2>&1 | FileCheck %s --check-prefix=PROF
// RUN: not mapp-opt %s -mapp-fuse -mapp-fuse-report=profile=%t.missing -o /dev/null 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: mapp-translate --import-gpt-config %mapp_src/examples/llama-tiny.json | mapp-opt -mapp-autodiff -mapp-optimizer -mapp-fuse -mapp-fuse-report -o /dev/null 2>&1 | FileCheck %s --check-prefix=LLAMA

// --mapp-fuse-report (docs/fusion.md): per region its ops and what fusion
// saves, closed forms on f32 [4, 8] (32 elements, 128 B):
// silu, mul, add of an [8] bias: unfused (32+32) + (32+32+32) + (32+8+32)
// = 232 elements = 928 B in 3 launches; fused x, y, b in and one result
// out = 128+128+32+128 = 416 B in 1: saves 512 B (55%) and 2 launches;
// with 100 GB/s and 2 us an op: 512 / 100e3 us + 2 x 2 us = 4.01 us.

// CHECK: remark: fuse: layers.0.mlp: 3 ops (silu, mul, add) over [4, 8]: unfused 928 B in 3 launches, fused 416 B in 1: saves 512 B (55%) and 2 launches
// PROF: remark: fuse: layers.0.mlp: {{.*}} saves 512 B (55%) and 2 launches, ~4.01 us with the profile
func.func @chain(%x: tensor<4x8xf32>, %y: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %s = mapp.silu %x : tensor<4x8xf32>
  %m = mapp.mul %s, %y : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %a = mapp.add %m, %b {mapp.name = "layers.0.mlp"} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  return %a : tensor<4x8xf32>
}
// CHECK: remark: fuse: @chain: 1 regions of 3 ops: unfused 928 B

// A bias gradient: mul then the sum over the rows. Unfused (32+32+32) +
// (32+8) = 136 elements = 544 B; fused 128+128 in, 32 out = 288 B: saves
// 256 B (47%) and 1 launch.
// CHECK: remark: fuse: (unnamed): 2 ops (mul, reduce_sum) over [4, 8]: unfused 544 B in 2 launches, fused 288 B in 1: saves 256 B (47%) and 1 launches
func.func @bias_grad(%g: tensor<4x8xf32>, %d: tensor<4x8xf32>) -> tensor<8xf32> {
  %m = mapp.mul %g, %d : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %r = mapp.reduce_sum %m {dims = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<8xf32>
  return %r : tensor<8xf32>
}
// CHECK: remark: fuse: @bias_grad: 1 regions of 2 ops
// CHECK: remark: fuse: module: 2 regions of 5 ops: unfused 1472 B in 5 launches, fused 704 B in 2: saves 768 B (52%) and 3 launches

// BAD: error: --mapp-fuse-report: cannot open '{{.*}}.missing'

// A model's whole step (its norms are mapp.rms_norm ops, not written
// out): SwiGLU's silu and mul, forward and backward, and the module's
// saving.
// LLAMA-DAG: remark: fuse: layers.0.mlp.mul: 2 ops (silu, mul) over [4, 32, 176]
// LLAMA-DAG: remark: fuse: layers.0.mlp.silu.grad: 2 ops (mul, silu_grad) over [4, 32, 176]
// LLAMA: remark: fuse: module: {{[1-9][0-9]*}} regions of {{[0-9]+}} ops: unfused {{[0-9]+}} B in {{[0-9]+}} launches, fused {{[0-9]+}} B in {{[0-9]+}}: saves {{[1-9][0-9]*}} B

// Bad options and inputs of --mapp-split-fwd-bwd and --mapp-fbd-keep-source.
// RUN: not mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2 fbd=true fwd-tp=3" 2>&1 | FileCheck %s --check-prefix=HEADS
// RUN: not mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="fbd=true transfer=teleport" 2>&1 | FileCheck %s --check-prefix=TRANSFER
// RUN: not mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="fbd=true fwd-device=tpu" 2>&1 | FileCheck %s --check-prefix=DEVICE
// RUN: not mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="pp=2 chunks=2 microbatches=2 schedule=interleaved fbd=true" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// RUN: mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-train-pipeline="tp=2" -o %t.mlir
// RUN: not mapp-opt %t.mlir --mapp-split-fwd-bwd="bwd-tp=1" 2>&1 | FileCheck %s --check-prefix=BWDTP
// RUN: not mapp-opt %t.mlir --mapp-split-fwd-bwd="fwd-tp=1" 2>&1 | FileCheck %s --check-prefix=NOSOURCE
// RUN: mapp-opt %t.mlir --mapp-split-fwd-bwd -o %t.split.mlir
// RUN: not mapp-opt %t.split.mlir --mapp-split-fwd-bwd 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not mapp-opt %S/../Parallel/Inputs/gpt-4l.mlir --mapp-split-fwd-bwd 2>&1 | FileCheck %s --check-prefix=FORWARD
// RUN: not mapp-opt %t.mlir --mapp-fbd-keep-source 2>&1 | FileCheck %s --check-prefix=KEEP

// The forward side's degree is checked like any tp, at the attention op of
// the input file.
// HEADS: gpt-4l.mlir:{{[0-9]+}}:{{[0-9]+}}: error: mapp-tensor-parallel: tp=3 does not divide num_attention_heads=4
// TRANSFER: error: mapp-split-fwd-bwd: transfer must be activations or recompute, got 'teleport'
// DEVICE: error: mapp-split-fwd-bwd: fwd-device must be cpu or cuda, got 'tpu'
// CHUNKS: error: mapp-split-fwd-bwd: interleaved chunks are not supported (chunks=2)
// BWDTP: error: mapp-split-fwd-bwd: bwd-tp=1 differs from the module's tp=2
// NOSOURCE: error: mapp-split-fwd-bwd: fwd-tp=1 differs from bwd-tp=2: the forward side is tensor-parallelized again from the forward graph, which the module does not carry
// TWICE: error: mapp-split-fwd-bwd: the module is already split (mapp.fbd)
// FORWARD: error: no function carries mapp.phase
// KEEP: error: mapp-fbd-keep-source: run it on the forward graph

// RUN: not mapp-opt %s -mapp-optimizer="optimizer=lion" 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not mapp-opt %s -mapp-optimizer="lr-schedule=cosine warmup=5 total-steps=5" 2>&1 | FileCheck %s --check-prefix=COS
// RUN: not mapp-opt %s -mapp-optimizer 2>&1 | FileCheck %s --check-prefix=NOGRAD

// OPT: error: mapp-optimizer: optimizer must be adamw or sgd, got 'lion'
// COS: error: mapp-optimizer: cosine schedule needs total-steps > warmup
// NOGRAD: error: mapp-optimizer: no parameter has a gradient; run --mapp-autodiff first

// Issue 43: every number finite and in its range (lr=inf was accepted), as a
// located error.
// RUN: not mapp-opt %s -mapp-optimizer="lr=inf" 2>&1 | FileCheck %s --check-prefix=LRINF
// RUN: not mapp-opt %s -mapp-optimizer="lr=nan" 2>&1 | FileCheck %s --check-prefix=LRNAN
// RUN: not mapp-opt %s -mapp-optimizer="lr=-0.1" 2>&1 | FileCheck %s --check-prefix=LRNEG
// RUN: not mapp-opt %s -mapp-optimizer="beta2=1" 2>&1 | FileCheck %s --check-prefix=BETA
// RUN: not mapp-opt %s -mapp-optimizer="eps=0" 2>&1 | FileCheck %s --check-prefix=EPS
// RUN: not mapp-opt %s -mapp-optimizer="optimizer=sgd momentum=-inf" 2>&1 | FileCheck %s --check-prefix=MOMENTUM
// RUN: not mapp-opt %s -mapp-optimizer="max-grad-norm=inf" 2>&1 | FileCheck %s --check-prefix=NORM
// RUN: not mapp-opt %s -mapp-optimizer="lr=0.1 min-lr=0.2" 2>&1 | FileCheck %s --check-prefix=MINLR
// LRINF: optimizer-errors.mlir:[[#]]:[[#]]: error: mapp-optimizer: lr must be finite and >= 0, got inf
// LRNAN: optimizer-errors.mlir:[[#]]:[[#]]: error: mapp-optimizer: lr must be finite and >= 0, got nan
// LRNEG: error: mapp-optimizer: lr must be finite and >= 0, got -0.1
// BETA: error: mapp-optimizer: beta2 must be in [0, 1), got 1
// EPS: error: mapp-optimizer: eps must be finite and > 0, got 0
// MOMENTUM: error: mapp-optimizer: momentum must be finite and >= 0, got -inf
// NORM: error: mapp-optimizer: max-grad-norm must be finite and >= 0, got inf
// MINLR: error: mapp-optimizer: min-lr must be within [0, lr], got 0.2
mapp.param @w : tensor<4xf32>

// RUN: not mapp-opt %s -mapp-optimizer="optimizer=lion" 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not mapp-opt %s -mapp-optimizer="lr-schedule=cosine warmup=5 total-steps=5" 2>&1 | FileCheck %s --check-prefix=COS
// RUN: not mapp-opt %s -mapp-optimizer 2>&1 | FileCheck %s --check-prefix=NOGRAD

// OPT: error: mapp-optimizer: optimizer must be adamw or sgd, got 'lion'
// COS: error: mapp-optimizer: cosine schedule needs total-steps > warmup
// NOGRAD: error: mapp-optimizer: no parameter has a gradient; run --mapp-autodiff first
mapp.param @w : tensor<4xf32>

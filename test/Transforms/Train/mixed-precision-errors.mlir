// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8" 2>&1 | FileCheck %s --check-prefix=FP8
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8 fp8-history=0" 2>&1 | FileCheck %s --check-prefix=HIST
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8 fp8-format=e3m4" 2>&1 | FileCheck %s --check-prefix=FMT
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8 fp8-margin=-1" 2>&1 | FileCheck %s --check-prefix=MARGIN
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp8 loss-scale=dynamic" 2>&1 | FileCheck %s --check-prefix=FP8LS
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=fp16 fp8-history=4" 2>&1 | FileCheck %s --check-prefix=FP8OPT
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="compute=int4" 2>&1 | FileCheck %s --check-prefix=COMPUTE
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="master=bf16" 2>&1 | FileCheck %s --check-prefix=MASTER
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="loss-scale=static:-3" 2>&1 | FileCheck %s --check-prefix=SPEC
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="loss-scale=sometimes" 2>&1 | FileCheck %s --check-prefix=SPEC
// RUN: not mapp-opt %s -mapp-autodiff -mapp-optimizer -mapp-mixed-precision="loss-scale=dynamic backoff-factor=1.5" 2>&1 | FileCheck %s --check-prefix=DYN
// RUN: not mapp-opt %s -mapp-mixed-precision="loss-scale=dynamic" 2>&1 | FileCheck %s --check-prefix=SEED
// RUN: not mapp-opt %s -mapp-autodiff -mapp-mixed-precision="loss-scale=dynamic" 2>&1 | FileCheck %s --check-prefix=OPT

// FP8: error: mapp-mixed-precision: compute=fp8 found no linear layer inside a transformer block
// HIST: error: mapp-mixed-precision: fp8-history must be >= 1 (steps of amax history), got 0
// FMT: error: mapp-mixed-precision: fp8-format must be hybrid (E4M3 forward, E5M2 gradients) or e4m3, got 'e3m4'
// MARGIN: error: mapp-mixed-precision: fp8-margin must be in [0, 64], got -1
// FP8LS: error: mapp-mixed-precision: compute=fp8 scales every fp8 tensor itself (delayed scaling); loss-scale must be none, got 'dynamic'
// FP8OPT: error: mapp-mixed-precision: fp8-format, fp8-history and fp8-margin need compute=fp8
// COMPUTE: error: mapp-mixed-precision: compute must be f32, bf16, fp16 or fp8, got 'int4'
// MASTER: error: mapp-mixed-precision: master must be f32
// SPEC: error: mapp-mixed-precision: loss-scale must be dynamic, static:S (S > 0) or none
// DYN: error: mapp-mixed-precision: dynamic loss scaling needs
// SEED: error: mapp-mixed-precision: no loss-gradient seed
// OPT: error: mapp-mixed-precision: no optimizer update to unscale; run --mapp-optimizer first

mapp.param @w : tensor<4x8xf32>
mapp.param @b : tensor<4xf32> {init = "zeros"}
func.func @forward(%t: tensor<2x8xi32>, %g: tensor<2xi32>) -> tensor<f32> {
  %x = mapp.fill 1.0 : tensor<2x8xf32>
  %w = mapp.param_ref @w : tensor<4x8xf32>
  %b = mapp.param_ref @b : tensor<4xf32>
  %y = mapp.linear %x, %w, %b : (tensor<2x8xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  %l = mapp.cross_entropy %y, %g : (tensor<2x4xf32>, tensor<2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

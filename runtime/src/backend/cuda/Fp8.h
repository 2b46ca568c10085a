//===- Fp8.h - fp8 kernels of the CUDA backend (internal) -------*- C++ -*-===//
//
// The recipe of mapp/rt/Fp8.h on the device (docs/cuda-backend.md, "FP8"):
// quantize kernels (scale, saturate, round to __nv_fp8_e4m3/__nv_fp8_e5m2,
// amax into the meta row with an atomic max on the float's bits, optionally
// the transposed copy cuBLASLt's "TN" layout needs, fused with the cast),
// the delayed-scaling update, and fp8 GEMMs through cuBLASLt (Fp8Gemm.cu)
// with a tiled fallback for shapes cuBLASLt's fp8 kernels do not take.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_FP8_H
#define MAPP_RT_CUDA_FP8_H

#include "mapp/rt/Fp8.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace mapp::rt::cuda {

class CudaBackend;

/// Quantizes src ([rows, cols], fp32, or bf16 with srcBf16) with the scale at
/// meta[0] into `straight` ([rows, cols] fp8) and/or `transposed` ([cols,
/// rows] fp8), either may be null; max-accumulates amax(|src|) into
/// meta[1]; writes 1/scale to *descale.
void fp8Quantize(const void *src, bool srcBf16, int64_t rows, int64_t cols, Fp8Format fmt,
                 float *meta, uint8_t *straight, uint8_t *transposed,
                 float *descale, cudaStream_t s);

/// fp8_update on one meta of 3 rows of (scale, h[0..history-1]).
void fp8UpdateMeta(float *meta, int64_t history, int64_t margin,
                   const Fp8Format (&fmts)[3], cudaStream_t s);

/// Row-major c[M,N] = (a[M,K]·b[N,K]ᵀ)·da·db (+ bias[N]), a and b fp8 (K
/// contiguous), fp32 accumulation; c fp32 or bf16. cuBLASLt when it takes
/// the shape (sm_89+, dims multiples of 16, e5m2 on one side at most),
/// else the tiled kernel. `fastAccum`: cuBLASLt's fp8 fast accumulation.
/// Returns true when cuBLASLt ran.
bool fp8Gemm(CudaBackend &be, const uint8_t *a, Fp8Format fa, const uint8_t *b,
             Fp8Format fb, const float *da, const float *db, void *c,
             bool cBf16, const float *bias, int64_t M, int64_t N, int64_t K,
             bool fastAccum);

/// How many fp8Gemm calls fell back to the tiled kernel for a reason other
/// than MAPP_CUDA_FP8_GEMM=tiled (each shape's first one is said on stderr).
int64_t fp8GemmFallbacks();

/// The tiled fallback (also what MAPP_CUDA_FP8_GEMM=tiled forces).
void fp8GemmTiled(const uint8_t *a, Fp8Format fa, const uint8_t *b,
                  Fp8Format fb, const float *da, const float *db, void *c,
                  bool cBf16, const float *bias, int64_t M, int64_t N, int64_t K,
                  cudaStream_t s);

} // namespace mapp::rt::cuda

#endif

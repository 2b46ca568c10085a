//===- Fp64Reference.h - double-precision kernel references -----*- C++ -*-===//
//
// Naive host loops in double for the kernels whose CPU-backend version runs
// fp32 arithmetic (OpenBLAS sgemm inside linear, matmul and attention), and
// for the fused GEMM pairs. Inputs are the values the device saw (already
// bf16-rounded where it stores or computes in bf16); outputs are exact up to
// double rounding. See docs/cuda-backend.md, "Tests", for which reference
// each kernel family is checked against.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TEST_GPU_FP64_REFERENCE_H
#define MAPP_TEST_GPU_FP64_REFERENCE_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Tensor.h"

#include <string>
#include <vector>

namespace mapp::test {

using Doubles = std::vector<double>;

/// Fills `out` (one vector per output) for linear, matmul, attention,
/// attention_grad and fused; false for any other kernel.
bool fp64Reference(const std::string &kernel, const rt::Attrs &attrs,
                   const std::vector<rt::TensorType> &inTypes,
                   const std::vector<const float *> &in,
                   const std::vector<rt::TensorType> &outTypes,
                   std::vector<Doubles> &out);

/// A `fused` call (mapp.fused program) in double (FusedFp64.cpp).
bool fusedFp64(const rt::Attrs &attrs, const std::vector<rt::TensorType> &inTypes,
               const std::vector<const float *> &in, std::vector<Doubles> &out);

/// y[r,n] = Σ_k x[r,k]·w[n,k] (+ b[n]).
Doubles linearRef(const float *x, const float *w, const float *b, int64_t rows,
                  int64_t n, int64_t k);
/// gelu with the tanh approximation, in double.
double geluTanh(double v);

} // namespace mapp::test

#endif

//===- ProbeTestSupport.h - shared helpers of the CUDA probe tests -*- C++ -*-===//
//
// Device tensors from host values and back, a collecting ProbeRuntime, the
// kernel context and the result line of mapp-cuda-probe-test's cases
// (CudaProbeTest.cpp; the logit lens in CudaProbeLensTest.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TEST_GPU_PROBE_TEST_SUPPORT_H
#define MAPP_TEST_GPU_PROBE_TEST_SUPPORT_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/Probe.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace mapp::rt::probe_test {

/// Collects samples; answers switch queries with `override` when set.
struct Collector : ProbeRuntime {
  std::mutex mu;
  std::vector<ProbeSample> got;
  bool hasOverride = false;
  SwitchState override;
  void record(ProbeSample &&s) override {
    std::lock_guard<std::mutex> l(mu);
    got.push_back(std::move(s));
  }
  bool switchState(int64_t, SwitchState &out) const override {
    if (hasOverride)
      out = override;
    return hasOverride;
  }
};

/// One generator for every case, in the order main() runs them.
inline std::mt19937_64 rng(12345);

inline float roundBf16(float x) { return bf16ToFloat(floatToBf16(x)); }

inline Tensor upload(const std::vector<float> &h, const Shape &s, bool bf16) {
  Tensor t;
  t.type = {bf16 ? DType::BF16 : DType::F32, s};
  size_t n = h.size();
  if (cudaMalloc(&t.data, std::max<size_t>(n, 1) * 4) != cudaSuccess)
    fail("cudaMalloc failed");
  if (bf16) {
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i)
      b[i] = floatToBf16(h[i]);
    cudaMemcpy(t.data, b.data(), n * 2, cudaMemcpyHostToDevice);
  } else {
    cudaMemcpy(t.data, h.data(), n * 4, cudaMemcpyHostToDevice);
  }
  return t;
}

inline std::vector<float> download(const Tensor &t) {
  int64_t n = t.numel();
  std::vector<float> out(n);
  if (t.type.dtype == DType::BF16) {
    std::vector<uint16_t> b(n);
    cudaMemcpy(b.data(), t.data, n * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; ++i)
      out[i] = bf16ToFloat(b[i]);
  } else {
    cudaMemcpy(out.data(), t.data, n * 4, cudaMemcpyDeviceToHost);
  }
  return out;
}

inline KernelContext context(Backend *be, ProbeRuntime *rt) {
  KernelContext c;
  c.step = 3;
  c.microbatch = 1;
  c.pool = &be->pool();
  c.backend = be;
  c.probe = rt;
  return c;
}

inline bool near(double a, double b, double tol) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b);
  return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b));
}

inline bool report(const char *mode, const std::string &name, const std::string &err) {
  std::printf("%-5s %-44s %s%s\n", mode, name.c_str(), err.empty() ? "ok" : "FAIL ",
              err.c_str());
  return err.empty();
}

inline Attrs probeAttrs(const std::string &reduce) {
  Attrs a;
  a.setInt("probe_id", 5);
  a.setStr("reduce", reduce);
  return a;
}

/// The logit lens cases (CudaProbeLensTest.cpp): adds its cases to
/// `total` and returns how many failed.
int runLensChecks(Backend &gpu, int &total);

} // namespace mapp::rt::probe_test

#endif

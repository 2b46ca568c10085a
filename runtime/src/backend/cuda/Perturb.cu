//===- Perturb.cu - MegaScope perturbations on the device -----------------===//
//
// The CUDA "perturb" kernel: src/kernel/Perturb.cpp element for element. The
// counter RNG (ProbeRngDevice.cuh) is evaluated per element index with the
// same key, so the device draws the same numbers for the same elements as
// the CPU; values are computed in float/double as the CPU does and stored
// through the storage view (bf16 rounding when the value is stored bf16).
// The switch's live state (ProbeControl) is read on the host per call and
// passed as kernel arguments: no device synchronization.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "ProbeCapture.h"
#include "ProbeRngDevice.cuh"
#include "../../kernel/ProbeRng.h"

#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

enum Kind { kCopy, kGaussian, kUniform, kOffset, kMask, kBitflip, kInt8, kFp8 };

Kind kindOf(const std::string &k) {
  static const std::pair<const char *, Kind> kinds[] = {
      {"gaussian", kGaussian}, {"uniform", kUniform}, {"offset", kOffset},
      {"mask", kMask},         {"bitflip", kBitflip}, {"int8", kInt8},
      {"fp8", kFp8}};
  for (const auto &p : kinds)
    if (k == p.first)
      return p.second;
  fail("perturb: unknown kind '", k, "'");
}

struct PerturbParams {
  Kind kind;
  double m, p;
  uint64_t key;
  const int64_t *channels;
  int64_t nchannels, lastDim;
  const float *amax; // int8: device absmax of x
};

/// Perturb.cpp's roundFp8E4M3 in the same double arithmetic.
__device__ float roundFp8E4M3(float x) {
  if (x != x)
    return x;
  double a = fabs(static_cast<double>(x));
  double q = a >= 0.015625 ? ldexp(1.0, ilogb(a) - 3) : 0.001953125;
  double r = rint(a / q) * q;
  return static_cast<float>(copysign(r < 448.0 ? r : 448.0, static_cast<double>(x)));
}

__device__ bool masked(const PerturbParams &pp, int64_t i) {
  int64_t c = i % pp.lastDim;
  for (int64_t j = 0; j < pp.nchannels; ++j)
    if (pp.channels[j] == c)
      return true;
  return false;
}

__global__ void perturbKernel(DView x, DView y, int64_t n, PerturbParams pp) {
  float sc = 0;
  bool quantize = false;
  if (pp.kind == kInt8) {
    float amax = *pp.amax;
    quantize = amax != 0 && isfinite(amax);
    sc = amax / 127.f;
  }
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = x.ld(i);
    switch (pp.kind) {
    case kGaussian:
      v = static_cast<float>(v + pp.m * device_rng::normal(pp.key, i));
      break;
    case kUniform:
      v = static_cast<float>(
          v * (1.0 - pp.m + 2.0 * pp.m * device_rng::uniform(pp.key, i)));
      break;
    case kOffset:
      v = static_cast<float>(v + pp.m);
      break;
    case kMask:
      if (masked(pp, i))
        v = 0.f;
      break;
    case kBitflip:
      if (device_rng::uniform(pp.key, 2 * i) < pp.p) {
        int bit = static_cast<int>(device_rng::uniform(pp.key, 2 * i + 1) * 32);
        v = __uint_as_float(__float_as_uint(v) ^ (1u << bit));
      }
      break;
    case kInt8:
      if (quantize)
        v = fminf(fmaxf(rintf(v / sc), -127.f), 127.f) * sc;
      break;
    case kFp8:
      v = roundFp8E4M3(v);
      break;
    case kCopy:
      break;
    }
    y.st(i, v);
  }
}

/// |x| max over non-NaN elements as ordered int bits (non-negative floats
/// order as their encodings), as std::max over fabs skips NaN.
__global__ void absmaxKernel(DView x, int64_t n, unsigned *out) {
  float m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float a = fabsf(x.ld(i));
    m = a > m ? a : m;
  }
  m = warpMax(m);
  if ((threadIdx.x & 31) == 0)
    atomicMax(out, __float_as_uint(m));
}

} // namespace

void cuda::perturb(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t st = be.stream();
  SwitchState s;
  s.enabled = a.attrs.getInt("enabled", 1) != 0;
  s.magnitude = a.attrs.getFloat("magnitude", 0);
  if (a.ctx.probe)
    a.ctx.probe->switchState(a.attrs.getInt("switch_id", 0), s);
  const Tensor &x = a.in[0];
  const Tensor &y = a.out[0];
  int64_t n = x.numel();
  if (!n)
    return;
  PerturbParams pp{};
  pp.kind = s.enabled ? kindOf(a.attrs.getStr("kind", "")) : kCopy;
  pp.m = s.magnitude;
  pp.p = a.attrs.getFloat("p", 0);
  pp.key = mapp::rt::probe_rng::stepKey(static_cast<uint64_t>(a.attrs.getInt("seed", 0)),
                              a.ctx.step, a.ctx.microbatch);
  pp.lastDim = x.rank() ? x.dim(-1) : 1;
  ProbeCapture &cap = be.probeCapture();
  if (pp.kind == kMask) {
    std::vector<int64_t> ch = a.attrs.getInts("channels");
    pp.channels = cap.constants().ints(&a.attrs, 1, ch);
    pp.nchannels = static_cast<int64_t>(ch.size());
  }
  if (pp.kind == kInt8) {
    unsigned *amax = static_cast<unsigned *>(cap.work(sizeof(unsigned), 2));
    MAPP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(unsigned), st));
    absmaxKernel<<<gridFor(n, 256), 256, 0, st>>>(view(x), n, amax);
    MAPP_CUDA_LAUNCHED();
    pp.amax = reinterpret_cast<const float *>(amax);
  }
  perturbKernel<<<gridFor(n, 256), 256, 0, st>>>(view(x), view(y), n, pp);
  MAPP_CUDA_LAUNCHED();
}

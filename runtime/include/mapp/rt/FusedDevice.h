//===- FusedDevice.h - what a generated fused kernel includes ---*- C++ -*-===//
//
// The part of a `mapp.fused` program's meaning that runs per element, shared
// by every evaluator (docs/fusion.md): the op table, the scalar semantics
// (`apply`: those of the unfused kernels, math in double rounded once to
// float, + − × ÷ in float), bf16 storage as bits (round to nearest even, as
// DType.cpp), the argument block of a generated kernel and its loops.
//
// Three compilers read this file: the host C++ compiler (FusedProgram.h,
// the CPU evaluator, the CUDA launcher), nvcc, and NVRTC, which gets its
// text embedded in every generated kernel's source (FusedCodegen.cpp) — so
// it includes no standard header under NVRTC (__CUDACC_RTC__): the math
// functions are NVRTC's built-ins. One copy of the math serves all three.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FUSEDDEVICE_H
#define MAPP_RT_FUSEDDEVICE_H

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#endif

#ifdef __CUDACC__
#define MAPP_FUSED_HD __host__ __device__
#else
#define MAPP_FUSED_HD
#endif

namespace mapp::rt::fused {

// X(enum, name, arity, immediate): immediate 0 none, 1 float, 2 gelu
// approximation, 3 reduced dims.
#define MAPP_FUSED_OPS(X)                                                      \
  X(Neg, "neg", 1, 0) X(Abs, "abs", 1, 0) X(Sign, "sign", 1, 0)                \
  X(Exp, "exp", 1, 0) X(Log, "log", 1, 0) X(Sqrt, "sqrt", 1, 0)                \
  X(Rsqrt, "rsqrt", 1, 0) X(Tanh, "tanh", 1, 0) X(Sin, "sin", 1, 0)            \
  X(Cos, "cos", 1, 0) X(Sigmoid, "sigmoid", 1, 0) X(Silu, "silu", 1, 0)        \
  X(Pow, "pow", 1, 1) X(Scale, "scale", 1, 1) X(Softcap, "softcap", 1, 1)      \
  X(Gelu, "gelu", 1, 2)                                                        \
  X(Add, "add", 2, 0) X(Mul, "mul", 2, 0) X(Sub, "sub", 2, 0)                  \
  X(Div, "div", 2, 0) X(Maximum, "maximum", 2, 0)                              \
  X(Minimum, "minimum", 2, 0) X(Lt, "lt", 2, 0) X(Le, "le", 2, 0)              \
  X(Gt, "gt", 2, 0) X(Ge, "ge", 2, 0) X(Eq, "eq", 2, 0) X(Ne, "ne", 2, 0)      \
  X(SiluGrad, "silu_grad", 2, 0) X(GeluGrad, "gelu_grad", 2, 2)                \
  X(SoftcapGrad, "softcap_grad", 2, 1) X(Select, "select", 3, 0)               \
  X(ReduceSum, "reduce_sum", 1, 3)

enum class Op : int {
#define MAPP_FUSED_ENUM(e, n, a, i) e,
  MAPP_FUSED_OPS(MAPP_FUSED_ENUM)
#undef MAPP_FUSED_ENUM
};

// Scalar semantics, exactly the unfused kernels' (see the file comment).
constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2/pi)
constexpr double kGeluKappa = 0.044715;
constexpr double kInvSqrt2Pi = 0.39894228040143267794; // 1/sqrt(2 pi)

MAPP_FUSED_HD inline float geluScalar(float x, bool tanhApprox) {
  double v = x;
  if (tanhApprox)
    return static_cast<float>(0.5 * v * (1 + ::tanh(kSqrt2OverPi * (v + kGeluKappa * v * v * v))));
  return static_cast<float>(0.5 * v * (1 + ::erf(v * 0.70710678118654752440)));
}

MAPP_FUSED_HD inline float geluGradScalar(float dy, float x, bool tanhApprox) {
  double v = x;
  if (tanhApprox) {
    double t = ::tanh(kSqrt2OverPi * (v + kGeluKappa * v * v * v));
    double dinner = kSqrt2OverPi * (1 + 3 * kGeluKappa * v * v);
    return static_cast<float>(dy * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * dinner));
  }
  double cdf = 0.5 * (1 + ::erf(v * 0.70710678118654752440));
  double pdf = ::exp(-0.5 * v * v) * kInvSqrt2Pi;
  return static_cast<float>(dy * (cdf + v * pdf));
}

MAPP_FUSED_HD inline float siluScalar(float x) {
  double v = x;
  return static_cast<float>(v / (1 + ::exp(-v)));
}

MAPP_FUSED_HD inline float siluGradScalar(float dy, float x) {
  double v = x;
  double s = 1 / (1 + ::exp(-v));
  return static_cast<float>(dy * s * (1 + v * (1 - s)));
}

/// One statement on scalars (b, c unused below its arity); not reduce_sum.
MAPP_FUSED_HD inline float apply(Op op, float a, float b, float c, double imm, bool tanhApprox) {
  double v = a;
  switch (op) {
  case Op::Neg: return static_cast<float>(-v);
  case Op::Abs: return static_cast<float>(::fabs(v));
  case Op::Sign: return v > 0 ? 1.f : v < 0 ? -1.f : 0.f;
  case Op::Exp: return static_cast<float>(::exp(v));
  case Op::Log: return static_cast<float>(::log(v));
  case Op::Sqrt: return static_cast<float>(::sqrt(v));
  case Op::Rsqrt: return static_cast<float>(1.0 / ::sqrt(v));
  case Op::Tanh: return static_cast<float>(::tanh(v));
  case Op::Sin: return static_cast<float>(::sin(v));
  case Op::Cos: return static_cast<float>(::cos(v));
  case Op::Sigmoid: return static_cast<float>(1.0 / (1.0 + ::exp(-v)));
  case Op::Silu: return siluScalar(a);
  case Op::Pow: return static_cast<float>(::pow(v, imm));
  // PyTorch multiplies a float tensor by a Python float in float precision.
  case Op::Scale: return a * static_cast<float>(imm);
  case Op::Softcap: return static_cast<float>(imm * ::tanh(a / imm));
  case Op::Gelu: return geluScalar(a, tanhApprox);
  case Op::Add: return a + b;
  case Op::Mul: return a * b;
  case Op::Sub: return a - b;
  case Op::Div: return a / b;
  // NaN propagates as in torch.maximum / torch.minimum.
  case Op::Maximum: return a != a || b != b ? a + b : (a > b ? a : b);
  case Op::Minimum: return a != a || b != b ? a + b : (a < b ? a : b);
  case Op::Lt: return a < b ? 1.f : 0.f;
  case Op::Le: return a <= b ? 1.f : 0.f;
  case Op::Gt: return a > b ? 1.f : 0.f;
  case Op::Ge: return a >= b ? 1.f : 0.f;
  case Op::Eq: return a == b ? 1.f : 0.f;
  case Op::Ne: return a != b ? 1.f : 0.f;
  case Op::SiluGrad: return siluGradScalar(a, b);
  case Op::GeluGrad: return geluGradScalar(a, b, tanhApprox);
  case Op::SoftcapGrad: {
    double t = ::tanh(b / imm);
    return static_cast<float>(a * (1 - t * t));
  }
  case Op::Select: return a != 0.0f ? b : c;
  case Op::ReduceSum: return a;
  }
  return a;
}


// --- storage: fp32 or bf16 elements, converted as DType.cpp does.
MAPP_FUSED_HD inline float bitsToFloat(unsigned u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

MAPP_FUSED_HD inline unsigned floatToBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

MAPP_FUSED_HD inline float loadF32(const void *p, long long i) {
  return static_cast<const float *>(p)[i];
}
MAPP_FUSED_HD inline float loadBf16(const void *p, long long i) {
  return bitsToFloat(static_cast<unsigned>(static_cast<const unsigned short *>(p)[i]) << 16);
}
MAPP_FUSED_HD inline void storeF32(void *p, long long i, float v) {
  static_cast<float *>(p)[i] = v;
}
MAPP_FUSED_HD inline void storeBf16(void *p, long long i, float v) {
  unsigned bits = floatToBits(v);
  unsigned short h = v != v ? 0x7FC0
                            : static_cast<unsigned short>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  static_cast<unsigned short *>(p)[i] = h;
}

// --- the argument block of a generated kernel (by value, one per launch).
// The domain is walked in an order where the kept dims come first and the
// reduced dims last (the identity without a reduction): element v of that
// order has coordinates c[d] along dom[d]; operand k is read at
// Σ c[d]·inStride[k][d] (0 along a broadcast dim), a domain-shaped result is
// written at Σ c[d]·linStride[d] (its row-major place), the reduction's
// result at v / inner.
constexpr int kMaxRank = 8;
constexpr int kMaxInputs = 32;
constexpr int kMaxOutputs = 16;
constexpr int kReduceThreads = 256;

struct KernelParams {
  long long n;     // domain elements
  long long inner; // reduced elements per result (1 without a reduction)
  long long outer; // n / inner
  // Every operand and result is stored at the element's walk index (no
  // broadcast, walk order = memory order): the kernel skips the coordinate
  // arithmetic, whose 64-bit divisions cost more than the element's bytes.
  int flat;
  long long dom[kMaxRank];
  long long linStride[kMaxRank];
  long long inStride[kMaxInputs][kMaxRank];
  const void *in[kMaxInputs];
  void *out[kMaxOutputs];
};

/// Threads per block of a reduction: a power of two, no more than needed.
MAPP_FUSED_HD inline int reduceThreads(long long inner) {
  int t = 32;
  while (t < kReduceThreads && t < inner)
    t *= 2;
  return t;
}

#if defined(__CUDACC__)
// The loops every generated kernel runs; P (generated) supplies
// `static float point(const KernelParams &, long long v)` (loads, the
// statements, the domain-shaped stores; returns the reduced value) and
// `static void storeReduced(const KernelParams &, long long o, float)`.
template <class P> __device__ void elementwiseLoop(const KernelParams &a) {
  for (long long v = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; v < a.n;
       v += static_cast<long long>(gridDim.x) * blockDim.x)
    P::point(a, v);
}

/// One block per result (striding over them): each thread sums its stride
/// of the reduced elements in double, then a fixed tree over the threads —
/// the same order every run, no atomics (bit-reproducible).
template <class P> __device__ void reduceLoop(const KernelParams &a) {
  __shared__ double part[kReduceThreads];
  for (long long o = blockIdx.x; o < a.outer; o += gridDim.x) {
    double s = 0;
    for (long long j = threadIdx.x; j < a.inner; j += blockDim.x)
      s += P::point(a, o * a.inner + j);
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w)
        part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0)
      P::storeReduced(a, o, static_cast<float>(part[0]));
    __syncthreads();
  }
}
#endif

#ifdef MAPP_FUSED_HOST
/// The device loops' order on the host, for the generator's host check
/// (test/runtime-unit/FusedCodegenCheck.cpp): the same per-thread strides
/// and the same tree, so its sums are the kernel's.
template <class P> void hostLoop(const KernelParams &a, bool reduces) {
  if (!reduces) {
    for (long long v = 0; v < a.n; ++v)
      P::point(a, v);
    return;
  }
  int threads = reduceThreads(a.inner);
  double part[kReduceThreads];
  for (long long o = 0; o < a.outer; ++o) {
    for (int t = 0; t < threads; ++t) {
      part[t] = 0;
      for (long long j = t; j < a.inner; j += threads)
        part[t] += P::point(a, o * a.inner + j);
    }
    for (int w = threads / 2; w > 0; w >>= 1)
      for (int t = 0; t < w; ++t)
        part[t] += part[t + w];
    P::storeReduced(a, o, static_cast<float>(part[0]));
  }
}
#endif

} // namespace mapp::rt::fused

#endif

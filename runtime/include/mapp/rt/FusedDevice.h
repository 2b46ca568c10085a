//===- FusedDevice.h - what a generated fused kernel includes ---*- C++ -*-===//
//
// The part of a `mapp.fused` program's meaning that runs per element, shared
// by every evaluator (docs/fusion.md): the op table, the scalar semantics
// (`apply`: those of the unfused kernels, math in double rounded once to
// float, + − × ÷ in float; on the GPU the math in float), bf16 storage as
// bits (round to nearest even, as DType.cpp), the argument block of a
// generated kernel and its loops.
//
// Three compilers read this file: the host C++ compiler (FusedProgram.h,
// the CPU evaluator, the CUDA launcher), nvcc, and NVRTC, which gets its
// text embedded in every generated kernel's source (FusedCodegen.cpp) — so
// it includes no standard header under NVRTC (__CUDACC_RTC__): the math
// functions are NVRTC's built-ins. One copy of the math serves all three.
//
// On the GPU (__CUDA_ARCH__) the transcendental functions run in float
// (CUDA's expf, tanhf, erff, ...: at most 2 ulp): FP64 runs at half FP32's
// rate or less, and a silu in double costs more than its element's bytes
// (the LLaMA's SwiGLU regions ran at 1.6× inductor's time). The host keeps
// double, so the CPU evaluator stays bit-identical to the unfused CPU
// kernels; the GPU agrees with it within a few float ulp before storage.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FUSEDDEVICE_H
#define MAPP_RT_FUSEDDEVICE_H

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstring>
#endif
#if defined(__CUDA_ARCH__) && !defined(__CUDACC_RTC__)
#include <vector_types.h> // uint4 (built in under NVRTC)
#endif

#ifdef __CUDACC__
#define MAPP_FUSED_HD __host__ __device__
#define MAPP_FUSED_UNROLL _Pragma("unroll")
#else
#define MAPP_FUSED_HD
#define MAPP_FUSED_UNROLL
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
  X(ReduceSum, "reduce_sum", 1, 3) X(ReduceMax, "reduce_max", 1, 3)

enum class Op : int {
#define MAPP_FUSED_ENUM(e, n, a, i) e,
  MAPP_FUSED_OPS(MAPP_FUSED_ENUM)
#undef MAPP_FUSED_ENUM
};

// Scalar semantics, exactly the unfused kernels' (see the file comment).
constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2/pi)
constexpr double kGeluKappa = 0.044715;
constexpr double kInvSqrt2Pi = 0.39894228040143267794; // 1/sqrt(2 pi)

#ifdef __CUDA_ARCH__
MAPP_FUSED_HD inline float geluScalar(float x, bool tanhApprox) {
  const float k = static_cast<float>(kSqrt2OverPi), c = static_cast<float>(kGeluKappa);
  if (tanhApprox)
    return 0.5f * x * (1.f + tanhf(k * (x + c * x * x * x)));
  return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f));
}

MAPP_FUSED_HD inline float geluGradScalar(float dy, float x, bool tanhApprox) {
  const float k = static_cast<float>(kSqrt2OverPi), c = static_cast<float>(kGeluKappa);
  if (tanhApprox) {
    float t = tanhf(k * (x + c * x * x * x));
    float dinner = k * (1.f + 3.f * c * x * x);
    return dy * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner);
  }
  float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752440f));
  float pdf = expf(-0.5f * x * x) * static_cast<float>(kInvSqrt2Pi);
  return dy * (cdf + x * pdf);
}

MAPP_FUSED_HD inline float siluScalar(float x) { return x / (1.f + expf(-x)); }

MAPP_FUSED_HD inline float siluGradScalar(float dy, float x) {
  float s = 1.f / (1.f + expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}
#else
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

#endif

/// A reduction statement (reduce_sum, reduce_max): its value sums or
/// maxes a statement over dims.
MAPP_FUSED_HD inline bool isReduce(Op op) { return op == Op::ReduceSum || op == Op::ReduceMax; }

/// reduce_max's step, the unfused kernel's (cpu::reduce_max, std::max(m, x)
/// from -inf): a NaN is never taken (a row of NaNs gives -inf), so the max
/// is the same in any order — up to the sign of a zero max, which keeps
/// the first zero met.
MAPP_FUSED_HD inline float maxStep(float m, float x) { return m < x ? x : m; }

/// One statement on scalars (b, c unused below its arity); not a reduction.
MAPP_FUSED_HD inline float apply(Op op, float a, float b, float c, double imm, bool tanhApprox) {
#ifdef __CUDA_ARCH__
  // The GPU's math in float (the file comment); x² exactly as the host's.
  const float f = static_cast<float>(imm);
  switch (op) {
  case Op::Neg: return -a;
  case Op::Abs: return fabsf(a);
  case Op::Exp: return expf(a);
  case Op::Log: return logf(a);
  case Op::Sqrt: return sqrtf(a);
  case Op::Rsqrt: return 1.f / sqrtf(a);
  case Op::Tanh: return tanhf(a);
  case Op::Sin: return sinf(a);
  case Op::Cos: return cosf(a);
  case Op::Sigmoid: return 1.f / (1.f + expf(-a));
  case Op::Pow: return imm == 2 ? a * a : powf(a, f);
  case Op::Softcap: return f * tanhf(a / f);
  case Op::SoftcapGrad: {
    float t = tanhf(b / f);
    return a * (1.f - t * t);
  }
  default: break;
  }
#endif
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
  case Op::ReduceMax: return a;
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

/// reduce_max's start (NVRTC has no <limits>).
MAPP_FUSED_HD inline float negInf() { return bitsToFloat(0xFF800000u); }

MAPP_FUSED_HD inline float loadF32(const void *p, long long i) {
  return static_cast<const float *>(p)[i];
}
MAPP_FUSED_HD inline float loadBf16(const void *p, long long i) {
  return bitsToFloat(static_cast<unsigned>(static_cast<const unsigned short *>(p)[i]) << 16);
}
MAPP_FUSED_HD inline void storeF32(void *p, long long i, float v) {
  static_cast<float *>(p)[i] = v;
}
MAPP_FUSED_HD inline unsigned short bf16Bits(float v) {
  unsigned bits = floatToBits(v);
  return v != v ? 0x7FC0
                : static_cast<unsigned short>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}
MAPP_FUSED_HD inline void storeBf16(void *p, long long i, float v) {
  static_cast<unsigned short *>(p)[i] = bf16Bits(v);
}

// --- 16-byte vectors: W consecutive elements from element v of a 16-byte
// aligned tensor (the flat path, KernelParams::vec): W/4 loads of f32, W/8
// of bf16 (8 x bf16 in one 16-byte word, the lower half first).
struct Word16 {
  unsigned u[4];
};

MAPP_FUSED_HD inline Word16 load16(const void *p) {
  Word16 w;
#ifdef __CUDA_ARCH__
  uint4 t = *static_cast<const uint4 *>(p); // one 128-bit load
  w.u[0] = t.x, w.u[1] = t.y, w.u[2] = t.z, w.u[3] = t.w;
#else
  std::memcpy(&w, p, 16);
#endif
  return w;
}
MAPP_FUSED_HD inline void store16(void *p, const Word16 &w) {
#ifdef __CUDA_ARCH__
  uint4 t;
  t.x = w.u[0], t.y = w.u[1], t.z = w.u[2], t.w = w.u[3];
  *static_cast<uint4 *>(p) = t;
#else
  std::memcpy(p, &w, 16);
#endif
}

template <int W> MAPP_FUSED_HD inline void loadVecF32(const void *p, long long v, float (&x)[W]) {
  for (int q = 0; q < W / 4; ++q) {
    Word16 w = load16(static_cast<const float *>(p) + v + 4 * q);
    for (int e = 0; e < 4; ++e)
      x[4 * q + e] = bitsToFloat(w.u[e]);
  }
}
template <int W> MAPP_FUSED_HD inline void loadVecBf16(const void *p, long long v, float (&x)[W]) {
  for (int q = 0; q < W / 8; ++q) {
    Word16 w = load16(static_cast<const unsigned short *>(p) + v + 8 * q);
    for (int e = 0; e < 4; ++e) {
      x[8 * q + 2 * e] = bitsToFloat(w.u[e] << 16);
      x[8 * q + 2 * e + 1] = bitsToFloat(w.u[e] & 0xFFFF0000u);
    }
  }
}
template <int W> MAPP_FUSED_HD inline void storeVecF32(void *p, long long v, const float (&x)[W]) {
  for (int q = 0; q < W / 4; ++q) {
    Word16 w;
    for (int e = 0; e < 4; ++e)
      w.u[e] = floatToBits(x[4 * q + e]);
    store16(static_cast<float *>(p) + v + 4 * q, w);
  }
}
template <int W> MAPP_FUSED_HD inline void storeVecBf16(void *p, long long v, const float (&x)[W]) {
  for (int q = 0; q < W / 8; ++q) {
    Word16 w;
    for (int e = 0; e < 4; ++e)
      w.u[e] = static_cast<unsigned>(bf16Bits(x[8 * q + 2 * e])) |
               static_cast<unsigned>(bf16Bits(x[8 * q + 2 * e + 1])) << 16;
    store16(static_cast<unsigned short *>(p) + v + 8 * q, w);
  }
}

// --- the argument block of a generated kernel (by value, one per launch).
// The domain is walked in an order where the kept dims come first and the
// reduced dims last (the identity without a reduction): element v of that
// order has coordinates c[d] along dom[d]; operand k is read at
// Σ c[d]·inStride[k][d] (0 along a broadcast dim), a domain-shaped result is
// written at Σ c[d]·linStride[d] (its row-major place), the reduction's
// result at v / inner. The limits are a fused program's (checkShapes: the
// dialect's verifier, the plan loader, --mapp-fuse's regions keep to them).
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
  // No reduction, every pointer 16-byte aligned and every operand read as
  // vecMode says: each thread takes W consecutive elements with 16-byte
  // loads and stores (P::vec), the last n mod W elements one by one.
  int vec;
  // Per operand on the vector path: 0 at the element's index; 1 at v mod
  // vecPeriod (a suffix of the domain's dims: a bias), W consecutive
  // elements; 2 at v / vecPeriod (a prefix: one value per row), one value
  // for all W. vecPeriod is a multiple of 8 (or n for mode 2), so a group
  // of W never straddles a period.
  int vecMode[kMaxInputs];
  long long vecPeriod[kMaxInputs];
  // A row program whose every operand is read at o * rowStride[k] + j *
  // colStride[k] (row o, element j of the row; 0 strides: broadcast) and
  // whose results are stored at o * inner + j: the kernel indexes by (o, j)
  // and skips the coordinate arithmetic of a broadcast operand (a norm's
  // weight, a row statistic) per element and pass.
  int rowAffine;
  long long rowStride[kMaxInputs];
  long long colStride[kMaxInputs];
  // n < 2^31: the coordinates of the non-flat path in 32-bit arithmetic (a
  // 64-bit division is a long instruction sequence on the GPU).
  int idx32;
  // A reduction whose results are the fastest-varying memory dim (the last
  // domain dim is kept: a bias gradient summed over the rows): columnLoop,
  // consecutive results across threadIdx.x, so a warp's loads coalesce.
  int columns;
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

/// The block of columnLoop: x consecutive results (32, halved down to 8
/// while that leaves fewer than kColumnBlocks blocks: a bias of 2048
/// columns still fills the GPU; 8 f32 are one 32-byte sector) by y rows (a
/// power of two, no more than needed), x * y <= kReduceThreads. A function
/// of the shape only, so the order of the sums is the same on every GPU.
constexpr long long kColumnBlocks = 264;
MAPP_FUSED_HD inline void columnShape(long long outer, long long inner, int &x, int &y) {
  x = 32;
  while (x > 8 && (outer + x - 1) / x < kColumnBlocks)
    x /= 2;
  y = 1;
  while (y < kReduceThreads / x && y < inner)
    y *= 2;
}

/// Operand k's W elements from element v (v a multiple of W) on the
/// vector path, as vecMode[k] says; the index arithmetic once per W.
template <int W, bool Bf16>
MAPP_FUSED_HD inline void loadOperandVec(const KernelParams &a, int k, long long v,
                                         float (&x)[W]) {
  long long p = a.vecPeriod[k];
  if (a.vecMode[k] == 2) {
    long long i = a.idx32 ? static_cast<unsigned>(v) / static_cast<unsigned>(p) : v / p;
    float t = Bf16 ? loadBf16(a.in[k], i) : loadF32(a.in[k], i);
    for (int e = 0; e < W; ++e)
      x[e] = t;
    return;
  }
  long long i = a.vecMode[k] == 0 ? v
                : a.idx32        ? static_cast<unsigned>(v) % static_cast<unsigned>(p)
                                 : v % p;
  if (Bf16)
    loadVecBf16<W>(a.in[k], i, x);
  else
    loadVecF32<W>(a.in[k], i, x);
}

#if defined(__CUDACC__)
// The loops every generated kernel runs; P (generated) supplies
// `static float point(const KernelParams &, long long v)` (loads, the
// statements, the domain-shaped stores; returns the reduced value),
// `static void vec(const KernelParams &, long long v)` (elements v..v+W-1
// of the vector path, without a reduction) and
// `static void storeReduced(const KernelParams &, long long o, float)`.
template <class P, int W> __device__ void elementwiseLoop(const KernelParams &a) {
  long long first = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  long long step = static_cast<long long>(gridDim.x) * blockDim.x, start = 0;
  if (a.vec) {
    long long groups = a.n / W;
    for (long long q = first; q < groups; q += step)
      P::vec(a, q * W);
    start = groups * W;
  }
  for (long long v = start + first; v < a.n; v += step)
    P::point(a, v);
}

/// The block's sum (or, Max, its maxStep max) of every thread's `s` by a
/// fixed tree over the threads (the same order every run, no atomics:
/// bit-reproducible); every thread gets it, and `part` is free again on
/// return.
template <bool Max = false> __device__ inline double blockTree(double s, double *part) {
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w)
      part[threadIdx.x] = Max ? maxStep(static_cast<float>(part[threadIdx.x]),
                                        static_cast<float>(part[threadIdx.x + w]))
                              : part[threadIdx.x] + part[threadIdx.x + w];
    __syncthreads();
  }
  double total = part[0];
  __syncthreads(); // every thread has read part[0] before its next use
  return total;
}
__device__ inline double blockTreeSum(double s, double *part) { return blockTree(s, part); }

/// One block per result (striding over them): each thread sums its stride
/// of the reduced elements in double, then blockTreeSum.
template <class P> __device__ void rowLoop(const KernelParams &a) {
  __shared__ double part[kReduceThreads];
  for (long long o = blockIdx.x; o < a.outer; o += gridDim.x) {
    double s = 0;
    for (long long j = threadIdx.x; j < a.inner; j += blockDim.x)
      s += P::point(a, o * a.inner + j);
    float total = static_cast<float>(blockTreeSum(s, part));
    if (threadIdx.x == 0)
      P::storeReduced(a, o, total);
  }
}

/// KernelParams::columns: a block of columnShape's x results (threadIdx.x)
/// by y rows (threadIdx.y, striding over the blocks' result groups); thread
/// (x, y) sums rows y, y + blockDim.y, ... of its result in double, then a
/// fixed tree over y — the same order every run, no atomics.
template <class P> __device__ void columnLoop(const KernelParams &a) {
  __shared__ double part[kReduceThreads];
  const int x = threadIdx.x, y = threadIdx.y, X = blockDim.x;
  for (long long o0 = blockIdx.x * static_cast<long long>(X); o0 < a.outer;
       o0 += static_cast<long long>(gridDim.x) * X) {
    long long o = o0 + x;
    double s = 0;
    if (o < a.outer)
      for (long long j = y; j < a.inner; j += blockDim.y)
        s += P::point(a, o * a.inner + j);
    part[y * X + x] = s;
    __syncthreads();
    for (int w = blockDim.y / 2; w > 0; w >>= 1) {
      if (y < w)
        part[y * X + x] += part[(y + w) * X + x];
      __syncthreads();
    }
    if (y == 0 && o < a.outer)
      P::storeReduced(a, o, static_cast<float>(part[x]));
    __syncthreads();
  }
}

template <class P> __device__ void reduceLoop(const KernelParams &a) {
  if (a.columns)
    columnLoop<P>(a);
  else
    rowLoop<P>(a);
}

// A row program (a norm, a softmax in one pass; FusedProgram.h): one block
// per row (striding over the rows). P (generated) supplies kPhases (its
// reductions), kMaxPhases (bit Ph: reduction Ph is a reduce_max), kStmts,
// `phase<Ph>(a, v, r)` (the statements before reduction Ph at element v;
// returns what it reduces), `rows<Q>(a, v, r, value)` (reduction Q-1's
// value, then the row statements up to reduction Q, into r), `point(a, v,
// r)` (every statement per element; the results of the domain's shape)
// and `storeRow(a, o, r)` (the row results). Pass Ph: each thread sums (in
// double) or maxes (maxStep) its stride of the row, a fixed tree over the
// threads (rowLoop's order), every thread reads the result.
template <class P, int Ph>
__device__ void rowPhases(const KernelParams &a, long long o, float *r, double *part) {
  if constexpr (Ph < P::kPhases) {
    constexpr bool kMax = (P::kMaxPhases >> Ph) & 1;
    double s = kMax ? negInf() : 0;
    for (long long j = threadIdx.x; j < a.inner; j += blockDim.x) {
      float x = P::template phase<Ph>(a, o, j, r);
      s = kMax ? maxStep(static_cast<float>(s), x) : s + x;
    }
    float value = static_cast<float>(blockTree<kMax>(s, part));
    P::template rows<Ph + 1>(a, o, r, value);
    rowPhases<P, Ph + 1>(a, o, r, part);
  }
}

template <class P> __device__ void rowProgramLoop(const KernelParams &a) {
  __shared__ double part[kReduceThreads];
  for (long long o = blockIdx.x; o < a.outer; o += gridDim.x) {
    float r[P::kStmts];
    P::template rows<0>(a, o, r, 0.f);
    rowPhases<P, 0>(a, o, r, part);
    for (long long j = threadIdx.x; j < a.inner; j += blockDim.x)
      P::point(a, o, j, r);
    if (threadIdx.x == 0)
      P::storeRow(a, o, r);
  }
}
#endif

#ifdef MAPP_FUSED_HOST
/// The device loops' order on the host, for the generator's host check
/// (test/runtime-unit/FusedCodegenCheck.cpp): the same vector groups, the
/// same per-thread strides and the same trees, so its sums are the kernel's.
template <class P, int W> void hostLoop(const KernelParams &a, bool reduces) {
  if (!reduces) {
    long long start = 0;
    if (a.vec) {
      for (long long q = 0; q < a.n / W; ++q)
        P::vec(a, q * W);
      start = a.n / W * W;
    }
    for (long long v = start; v < a.n; ++v)
      P::point(a, v);
    return;
  }
  int threads = reduceThreads(a.inner), rows = 0, unused;
  if (a.columns)
    columnShape(a.outer, a.inner, unused, rows);
  double part[kReduceThreads];
  for (long long o = 0; o < a.outer; ++o) {
    int ways = a.columns ? rows : threads;
    for (int t = 0; t < ways; ++t) {
      part[t] = 0;
      for (long long j = t; j < a.inner; j += ways)
        part[t] += P::point(a, o * a.inner + j);
    }
    for (int w = ways / 2; w > 0; w >>= 1)
      for (int t = 0; t < w; ++t)
        part[t] += part[t + w];
    P::storeReduced(a, o, static_cast<float>(part[0]));
  }
}

/// rowProgramLoop's order on the host: the same per-thread strides of
/// reduceThreads and the same tree per pass.
template <class P, int Ph> void hostRowPhases(const KernelParams &a, long long o, float *r) {
  if constexpr (Ph < P::kPhases) {
    constexpr bool kMax = (P::kMaxPhases >> Ph) & 1;
    int threads = reduceThreads(a.inner);
    double part[kReduceThreads];
    for (int t = 0; t < threads; ++t) {
      part[t] = kMax ? negInf() : 0;
      for (long long j = t; j < a.inner; j += threads) {
        float x = P::template phase<Ph>(a, o, j, r);
        part[t] = kMax ? maxStep(static_cast<float>(part[t]), x) : part[t] + x;
      }
    }
    for (int w = threads / 2; w > 0; w >>= 1)
      for (int t = 0; t < w; ++t)
        part[t] = kMax ? maxStep(static_cast<float>(part[t]), static_cast<float>(part[t + w]))
                       : part[t] + part[t + w];
    P::template rows<Ph + 1>(a, o, r, static_cast<float>(part[0]));
    hostRowPhases<P, Ph + 1>(a, o, r);
  }
}

template <class P> void hostRowLoop(const KernelParams &a) {
  for (long long o = 0; o < a.outer; ++o) {
    float r[P::kStmts];
    P::template rows<0>(a, o, r, 0.f);
    hostRowPhases<P, 0>(a, o, r);
    for (long long j = 0; j < a.inner; ++j)
      P::point(a, o, j, r);
    P::storeRow(a, o, r);
  }
}
#endif

} // namespace mapp::rt::fused

#endif

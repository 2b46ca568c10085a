//===- Algebra.cu - the tensor algebra's kernels (MappTensorOps.td) -------===//
//
// One generic elementwise kernel driven by an op code covers every unary,
// binary and select kernel of the algebra; broadcast, constant and cast
// are data movement. Loads and stores go through DView (fp32 or bf16
// storage), arithmetic is fp32, as in Elementwise.cu.
//
//===----------------------------------------------------------------------===//
#include "../../plan/AlgebraKernelChecks.h"
#include "CudaBackend.h"

#include <cuda_fp16.h>

#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr int kThreads = 256;

enum Code : int {
  kNeg, kAbs, kSign, kExp, kLog, kSqrt, kRsqrt, kTanh, kSin, kCos, kSigmoid, kPow,
  kSub, kDiv, kMaximum, kMinimum, kLt, kLe, kGt, kGe, kEq, kNe, kSelect
};

__device__ __forceinline__ float apply(int code, float x, float y, float z, float p) {
  switch (code) {
  case kNeg: return -x;
  case kAbs: return fabsf(x);
  case kSign: return x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f);
  case kExp: return expf(x);
  case kLog: return logf(x);
  case kSqrt: return sqrtf(x);
  case kRsqrt: return rsqrtf(x);
  case kTanh: return tanhf(x);
  case kSin: return sinf(x);
  case kCos: return cosf(x);
  case kSigmoid: return 1.f / (1.f + expf(-x));
  case kPow: return p == 2.f ? x * x : powf(x, p);
  case kSub: return x - y;
  case kDiv: return x / y;
  case kMaximum: return (x != x || y != y) ? x + y : fmaxf(x, y);
  case kMinimum: return (x != x || y != y) ? x + y : fminf(x, y);
  case kLt: return x < y ? 1.f : 0.f;
  case kLe: return x <= y ? 1.f : 0.f;
  case kGt: return x > y ? 1.f : 0.f;
  case kGe: return x >= y ? 1.f : 0.f;
  case kEq: return x == y ? 1.f : 0.f;
  case kNe: return x != y ? 1.f : 0.f;
  case kSelect: return x != 0.f ? y : z;
  }
  return 0.f;
}

/// o[i] = apply(code, a[i], b[i], c[i]); b and c unused (p null) by
/// unary codes, c by binary ones.
__global__ void algebraKernel(int code, DView a, DView b, DView c, DView o,
                              int64_t n, float p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float x = a.ld(i);
    float y = b.p ? b.ld(i) : 0.f;
    float z = c.p ? c.ld(i) : 0.f;
    o.st(i, apply(code, x, y, z, p));
  }
}

void launch(const KernelArgs &a, int code, float p = 0.f) {
  int64_t n = a.out[0].numel();
  if (!n)
    return;
  DView none{nullptr, 0};
  DView x = view(a.in[0]);
  DView y = a.numIn > 1 ? view(a.in[1]) : none;
  DView z = a.numIn > 2 ? view(a.in[2]) : none;
  algebraKernel<<<gridFor(n, kThreads), kThreads, 0, backendOf(a).stream()>>>(
      code, x, y, z, view(a.out[0]), n, p);
  MAPP_CUDA_LAUNCHED();
}

constexpr int kMaxRank = 8;
struct Strides {
  int64_t out[kMaxRank]; // result dims
  int64_t in[kMaxRank];  // x's stride per result dim, 0 where repeated
};

__global__ void broadcastKernel(DView x, DView y, int64_t n, int rank, Strides s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      off += (rest % s.out[d]) * s.in[d];
      rest /= s.out[d];
    }
    y.st(i, x.ld(off));
  }
}

__global__ void castKernel(const void *x, int xType, DView y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v;
    switch (xType) {
    case int(DType::BF16): v = __bfloat162float(static_cast<const __nv_bfloat16 *>(x)[i]); break;
    case int(DType::F16): v = __half2float(static_cast<const __half *>(x)[i]); break;
    case int(DType::I32): v = float(static_cast<const int32_t *>(x)[i]); break;
    case int(DType::I64): v = float(static_cast<const int64_t *>(x)[i]); break;
    default: v = static_cast<const float *>(x)[i]; break;
    }
    y.st(i, v);
  }
}

} // namespace

void cuda::neg(const KernelArgs &a) { launch(a, kNeg); }
void cuda::abs(const KernelArgs &a) { launch(a, kAbs); }
void cuda::sign(const KernelArgs &a) { launch(a, kSign); }
void cuda::exp(const KernelArgs &a) { launch(a, kExp); }
void cuda::log(const KernelArgs &a) { launch(a, kLog); }
void cuda::sqrt(const KernelArgs &a) { launch(a, kSqrt); }
void cuda::rsqrt(const KernelArgs &a) { launch(a, kRsqrt); }
void cuda::tanh(const KernelArgs &a) { launch(a, kTanh); }
void cuda::sin(const KernelArgs &a) { launch(a, kSin); }
void cuda::cos(const KernelArgs &a) { launch(a, kCos); }
void cuda::sigmoid(const KernelArgs &a) { launch(a, kSigmoid); }
void cuda::pow(const KernelArgs &a) {
  launch(a, kPow, static_cast<float>(a.attrs.getFloat("exponent", 1)));
}
void cuda::sub(const KernelArgs &a) { launch(a, kSub); }
void cuda::div(const KernelArgs &a) { launch(a, kDiv); }
void cuda::maximum(const KernelArgs &a) { launch(a, kMaximum); }
void cuda::minimum(const KernelArgs &a) { launch(a, kMinimum); }
void cuda::lt(const KernelArgs &a) { launch(a, kLt); }
void cuda::le(const KernelArgs &a) { launch(a, kLe); }
void cuda::gt(const KernelArgs &a) { launch(a, kGt); }
void cuda::ge(const KernelArgs &a) { launch(a, kGe); }
void cuda::eq(const KernelArgs &a) { launch(a, kEq); }
void cuda::ne(const KernelArgs &a) { launch(a, kNe); }
void cuda::select(const KernelArgs &a) { launch(a, kSelect); }

void cuda::broadcast(const KernelArgs &a) {
  const Tensor &x = a.in[0], &y = a.out[0];
  int64_t n = y.numel();
  int r = y.rank(), lead = r - x.rank();
  if (r > kMaxRank)
    fail("broadcast: rank ", r, " above ", kMaxRank);
  if (!n)
    return;
  Strides s{};
  int64_t stride = 1;
  for (int d = r - 1; d >= 0; --d) {
    s.out[d] = y.type.shape[d];
    int64_t xd = d >= lead ? x.type.shape[d - lead] : 1;
    s.in[d] = d >= lead && xd != 1 ? stride : 0;
    if (d >= lead)
      stride *= xd;
  }
  broadcastKernel<<<gridFor(n, kThreads), kThreads, 0, backendOf(a).stream()>>>(
      view(x), view(y), n, r, s);
  MAPP_CUDA_LAUNCHED();
}

void cuda::constant(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const std::vector<double> &v = algebra::constantValues(a.attrs);
  int64_t n = static_cast<int64_t>(v.size());
  if (!n)
    return;
  std::vector<float> host(v.begin(), v.end());
  float *tmp = static_cast<float *>(be.scratch(n * 4, 1));
  MAPP_CUDA_CHECK(cudaMemcpyAsync(tmp, host.data(), n * 4, cudaMemcpyHostToDevice,
                                  be.stream()));
  copyConvert({tmp, 0}, view(a.out[0]), n, be.stream());
  // The host buffer dies with this frame.
  MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
}

void cuda::cast(const KernelArgs &a) {
  int64_t n = a.out[0].numel();
  if (!n)
    return;
  castKernel<<<gridFor(n, kThreads), kThreads, 0, backendOf(a).stream()>>>(
      a.in[0].data, int(a.in[0].type.dtype), view(a.out[0]), n);
  MAPP_CUDA_LAUNCHED();
}

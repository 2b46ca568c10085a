//===- Algebra.cu - the tensor algebra's kernels (MappTensorOps.td) -------===//
//
// Broadcast, constant and cast: data movement. The algebra's pointwise
// kernels (unary, binary, select) are generated (FusedKernels.cu). Loads
// and stores go through DView (fp32 or bf16 storage).
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

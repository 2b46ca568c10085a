//===- Comm.cu - host-staged kernels: communication, MegaScope probes -----===//
//
// Every communication kernel (and MegaScope's probe/perturb) stages its operands through host fp32 buffers
// and runs the CPU backend's implementation of it, which talks to the
// Communicator: correct with any host communicator, slow (a device sync per
// call). This is the seam where a device-aware communicator (ranks as threads
// on one device, NCCL) will take device pointers directly.
//
//===----------------------------------------------------------------------===//
#include "../cpu/CpuKernels.h"
#include "CudaBackend.h"

#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// Host copy of a stored tensor as its plan type (bf16 storage → fp32).
std::vector<uint8_t> toHost(CudaBackend &be, const Tensor &t) {
  int64_t n = t.numel();
  bool f = t.type.dtype == DType::F32 || t.type.dtype == DType::BF16;
  std::vector<uint8_t> h(std::max<int64_t>(n, 1) * (f ? 4 : dtypeSize(t.type.dtype)));
  if (!n)
    return h;
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.scratch(n * 4, 1));
    copyConvert(view(t), {tmp, 0}, n, be.stream());
    be.copyFromStorage(h.data(), tmp, n * 4);
  } else {
    be.copyFromStorage(h.data(), t.data, n * storedSize(t));
  }
  return h;
}

void fromHost(CudaBackend &be, const std::vector<uint8_t> &h, const Tensor &t) {
  int64_t n = t.numel();
  if (!n)
    return;
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.scratch(n * 4, 1));
    MAPP_CUDA_CHECK(cudaMemcpyAsync(tmp, h.data(), n * 4, cudaMemcpyHostToDevice,
                                    be.stream()));
    copyConvert({tmp, 0}, view(t), n, be.stream());
  } else {
    MAPP_CUDA_CHECK(cudaMemcpyAsync(t.data, h.data(), n * storedSize(t),
                                    cudaMemcpyHostToDevice, be.stream()));
  }
  // The host buffer dies with the caller's frame.
  MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
}

Tensor hostView(std::vector<uint8_t> &h, const Tensor &t) {
  Tensor r;
  r.data = h.data();
  r.type = t.type;
  if (r.type.dtype == DType::BF16)
    r.type.dtype = DType::F32;
  return r;
}

void staged(const KernelArgs &a, KernelFn cpuFn) {
  CudaBackend &be = backendOf(a);
  std::vector<std::vector<uint8_t>> hin, hout;
  std::vector<Tensor> ti, to;
  for (int i = 0; i < a.numIn; ++i)
    hin.push_back(toHost(be, a.in[i]));
  for (int i = 0; i < a.numOut; ++i)
    hout.push_back(toHost(be, a.out[i]));
  for (int i = 0; i < a.numIn; ++i)
    ti.push_back(hostView(hin[i], a.in[i]));
  for (int i = 0; i < a.numOut; ++i)
    to.push_back(hostView(hout[i], a.out[i]));
  cpuFn({a.attrs, ti.data(), a.numIn, to.data(), a.numOut, a.ctx});
  for (int i = 0; i < a.numOut; ++i)
    fromHost(be, hout[i], a.out[i]);
}

} // namespace

void cuda::all_reduce(const KernelArgs &a) { staged(a, cpu::all_reduce); }
void cuda::all_gather(const KernelArgs &a) { staged(a, cpu::all_gather); }
void cuda::reduce_scatter(const KernelArgs &a) { staged(a, cpu::reduce_scatter); }
void cuda::all_to_all(const KernelArgs &a) { staged(a, cpu::all_to_all); }
void cuda::send(const KernelArgs &a) { staged(a, cpu::send); }
void cuda::recv(const KernelArgs &a) { staged(a, cpu::recv); }


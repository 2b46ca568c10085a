//===- Comm.cu - communication kernels of the CUDA backend ----------------===//
//
// Groups of one rank (the local communicator) are device copies. Larger
// groups go through the Communicator on host-staged fp32 buffers: correct with
// any host communicator, and the seam where a device-aware one (device-local
// ranks as threads, NCCL) plugs in later by taking device pointers directly.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "mapp/rt/Comm.h"

#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

Communicator &commOf(const KernelArgs &a, const char *kernel) {
  if (!a.ctx.comm)
    fail(kernel, ": no communicator attached");
  return *a.ctx.comm;
}

Group groupOf(const KernelArgs &a, const char *kernel) {
  std::string name = a.attrs.getStr("group", "dp");
  Group g;
  if (!parseGroup(name, g))
    fail(kernel, ": unknown group '", name, "'");
  return g;
}

std::vector<float> toHost(CudaBackend &be, const Tensor &t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.scratch(h.size() * 4 + 4, 1));
    copyConvert(view(t), {tmp, 0}, t.numel(), be.stream());
    be.copyFromStorage(h.data(), tmp, h.size() * 4);
  } else {
    be.copyFromStorage(h.data(), t.data, h.size() * 4);
  }
  return h;
}

void fromHost(CudaBackend &be, const std::vector<float> &h, const Tensor &t) {
  if (isBf16(t)) {
    float *tmp = static_cast<float *>(be.scratch(h.size() * 4 + 4, 1));
    MAPP_CUDA_CHECK(cudaMemcpyAsync(tmp, h.data(), h.size() * 4,
                                    cudaMemcpyHostToDevice, be.stream()));
    copyConvert({tmp, 0}, view(t), t.numel(), be.stream());
    MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
  } else {
    MAPP_CUDA_CHECK(cudaMemcpyAsync(t.data, h.data(), h.size() * 4,
                                    cudaMemcpyHostToDevice, be.stream()));
    MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
  }
}

void singleRankCopy(const KernelArgs &a, const char *kernel) {
  if (a.in[0].numel() != a.out[0].numel())
    fail(kernel, ": a single-rank group keeps the element count");
  copyConvert(view(a.in[0]), view(a.out[0]), a.in[0].numel(),
              backendOf(a).stream());
}

void singleRankOnly(const KernelArgs &a, const char *kernel) {
  Communicator &c = commOf(a, kernel);
  int n = c.groupSize(groupOf(a, kernel));
  if (n != 1)
    fail(kernel, ": groups of ", n, " ranks are not supported by the CUDA "
         "backend yet (only single-rank groups)");
  singleRankCopy(a, kernel);
}

} // namespace

void cuda::all_reduce(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_reduce");
  Group g = groupOf(a, "all_reduce");
  std::string red = a.attrs.getStr("reduction", "sum");
  ReduceOp op;
  if (!parseReduceOp(red, op))
    fail("all_reduce: unknown reduction '", red, "'");
  if (c.groupSize(g) == 1)
    return singleRankCopy(a, "all_reduce");
  CudaBackend &be = backendOf(a);
  std::vector<float> h = toHost(be, a.in[0]);
  c.allReduce(h.data(), static_cast<int64_t>(h.size()), op, g);
  fromHost(be, h, a.out[0]);
}

void cuda::all_gather(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_gather");
  Group g = groupOf(a, "all_gather");
  int n = c.groupSize(g);
  if (n == 1)
    return singleRankCopy(a, "all_gather");
  if (a.attrs.getInt("dim", 0) != 0 || a.out[0].numel() != n * a.in[0].numel())
    fail("all_gather: only dim 0 with y = ", n, " x x is supported");
  CudaBackend &be = backendOf(a);
  std::vector<float> in = toHost(be, a.in[0]);
  std::vector<float> out(static_cast<size_t>(a.out[0].numel()));
  c.allGather(in.data(), out.data(), a.in[0].numel(), g);
  fromHost(be, out, a.out[0]);
}

void cuda::reduce_scatter(const KernelArgs &a) {
  singleRankOnly(a, "reduce_scatter");
}

void cuda::all_to_all(const KernelArgs &a) { singleRankOnly(a, "all_to_all"); }

void cuda::send(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  Communicator &c = commOf(a, "send");
  std::vector<uint8_t> h(a.in[0].numel() * storedSize(a.in[0]));
  be.copyFromStorage(h.data(), a.in[0].data, h.size());
  c.send(h.data(), h.size(), static_cast<int>(a.attrs.getInt("peer", 0)),
         static_cast<int>(a.attrs.getInt("tag", 0)));
}

void cuda::recv(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  Communicator &c = commOf(a, "recv");
  std::vector<uint8_t> h(a.out[0].numel() * storedSize(a.out[0]));
  c.recv(h.data(), h.size(), static_cast<int>(a.attrs.getInt("peer", 0)),
         static_cast<int>(a.attrs.getInt("tag", 0)));
  be.copyToStorage(a.out[0].data, h.data(), h.size());
}

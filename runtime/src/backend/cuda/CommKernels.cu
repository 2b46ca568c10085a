//===- CommKernels.cu - communication kernels -----------------------------===//
//
// Communication kernels take device pointers when the communicator allows it
// (CudaBackend::deviceComm: rank-threads on one device, or NCCL) and add the
// tensor layouts here: gathering / scattering along any dim packs into
// member-major blocks with one permute kernel, like the CPU kernels do on
// the host. Otherwise (mpi, MAPP_CUDA_COMM=host) and for the
// tensor-parallel cross-entropy pieces (which only read the rank's group
// position), operands are staged through host fp32
// buffers and the CPU backend's kernel runs: correct with any host
// communicator, slow (a device sync per call).
//
//===----------------------------------------------------------------------===//
#include "../CollectiveArgs.h"
#include "../cpu/CpuKernels.h"
#include "../cpu/ExpertRoute.h"
#include "CommStaging.h"
#include "CudaBackend.h"
#include "DeviceComm.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

// Shared with the cp kernels (CommStaging.h).
namespace mapp::rt::cuda::commk {

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

/// Runs the CPU kernel on host copies; copies outputs back, and the inputs
/// too for kernels that update them in place (grad_sync, param_gather).
void staged(const KernelArgs &a, KernelFn cpuFn, bool writesInputs) {
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
  if (writesInputs)
    for (int i = 0; i < a.numIn; ++i)
      fromHost(be, hin[i], a.in[i]);
}

/// Device collectives for this kernel call, or null (stage through host).
DeviceComm *deviceCommOf(const KernelArgs &a, const char *kernel) {
  return backendOf(a).deviceComm(communicatorOf(a, kernel));
}

bool isFloat(DType d) { return d == DType::F32 || d == DType::BF16; }
bool isFloat(const Tensor &t) { return isFloat(t.type.dtype); }

CommGroup groupOf(const KernelArgs &a, const char *defaultGroup) {
  return kernelGroupOf(a, *a.ctx.comm, defaultGroup);
}


View3 view3(const Shape &s, int64_t dim) {
  View3 v;
  for (size_t i = 0; i < s.size(); ++i)
    (static_cast<int64_t>(i) < dim ? v.outer
     : static_cast<int64_t>(i) == dim ? v.mid
                                      : v.inner) *= s[i];
  return v;
}


/// Between [outer][n][block] (interleaved) and [n][outer][block]
/// (member-major): toMemberMajor packs, otherwise unpacks.
__global__ void permuteBlocks(DView src, DView dst, int64_t outer, int n,
                              int64_t block, int toMemberMajor) {
  int64_t total = outer * n * block;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t k = e % block, t = e / block, s;
    if (toMemberMajor) {
      int64_t m = t / outer, o = t % outer;
      s = (o * n + m) * block + k;
    } else {
      int64_t o = t / n, m = t % n;
      s = (m * outer + o) * block + k;
    }
    dst.st(e, src.ld(s));
  }
}

void permute(DView src, DView dst, int64_t outer, int n, int64_t block,
             bool toMemberMajor, cudaStream_t s) {
  int64_t total = outer * n * block;
  if (!total)
    return;
  permuteBlocks<<<gridFor(total, 256), 256, 0, s>>>(src, dst, outer, n, block,
                                                    toMemberMajor);
  MAPP_CUDA_LAUNCHED();
}

/// fp32 scratch of n elements in buffer `which` (0 or 3: free during a
/// communication kernel).
DView flatScratch(CudaBackend &be, int64_t n, int which) {
  return {be.scratch(std::max<int64_t>(n, 1) * 4, which), 0};
}

void copyThrough(CudaBackend &be, const Tensor &x, const Tensor &y) {
  if (x.data != y.data)
    copyConvert(view(x), view(y), x.numel(), be.stream());
}

int64_t runtimeTag(const KernelArgs &a) {
  return a.attrs.getInt("tag", 0) * a.ctx.numMicrobatches + a.ctx.microbatch;
}

// --- grad_sync / param_gather: the dp bucket as one flat fp32 buffer -----

int64_t bucketSize(const KernelArgs &a, int g) {
  int64_t n = 0;
  for (int i = 0; i < a.numIn; ++i)
    n += a.in[i].numel();
  return (n + g - 1) / g * g;
}

void packBucket(CudaBackend &be, const KernelArgs &a, DView flat, int64_t n) {
  int64_t off = 0;
  for (int i = 0; i < a.numIn; ++i) {
    copyConvert(view(a.in[i]), offsetView(flat, off), a.in[i].numel(),
                be.stream());
    off += a.in[i].numel();
  }
  if (n > off) // the zero padding up to a multiple of the group size
    fillZero(offsetView(flat, off), n - off, be.stream());
}

/// Writes src (holding bucket elements [lo, hi)) back into the operands, on
/// stream s (grad_sync: where the collective left its result).
void unpackBucket(const KernelArgs &a, DView src, int64_t lo, int64_t hi,
                  cudaStream_t s) {
  int64_t off = 0;
  for (int i = 0; i < a.numIn; ++i) {
    int64_t n = a.in[i].numel();
    int64_t b = std::max(lo, off), e = std::min(hi, off + n);
    if (b < e)
      copyConvert(offsetView(src, b - lo), offsetView(view(a.in[i]), b - off),
                  e - b, s);
    off += n;
  }
}

/// grad_sync's fp32 buffer `part` of n elements: the communicator's
/// per-bucket buffer when it overlaps the collective, else scratch 0 / 3.
DView gradBuffer(CudaBackend &be, DeviceComm &dc, const KernelArgs &a,
                 int part, int64_t n) {
  if (void *p = dc.gradBucketBuffer(a.in[0].data, part, n))
    return {p, 0};
  return flatScratch(be, n, part == 0 ? 0 : 3);
}

} // namespace mapp::rt::cuda::commk

using namespace mapp::rt::cuda::commk;

DeviceComm *CudaBackend::deviceComm(Communicator &host) {
  if (deviceCommChecked_)
    return deviceComm_.get();
  deviceCommChecked_ = true;
  if (config_.hostComm || host.worldSize() == 1) // MAPP_CUDA_COMM=host
    return nullptr;
#ifdef MAPP_HAVE_NCCL
  if (host.deviceImpl()) {
    deviceComm_ = createNcclDeviceComm(*this, host);
    return deviceComm_.get();
  }
#endif
  if (host.sharesAddressSpace())
    deviceComm_ = createLocalDeviceComm(*this, host);
  return deviceComm_.get();
}

size_t CudaBackend::postedRecvBytes(Communicator &host, const Value &v) {
  DeviceComm *dc = deviceComm(host);
  return dc && isFloat(v.type.dtype) && dc->letterBytes()
             ? dc->letterBytes()
             : Backend::postedRecvBytes(host, v);
}

bool CudaBackend::takePostedRecv(Communicator &host, const void *msg,
                                 const Tensor &out, int peer, int64_t tag) {
  DeviceComm *dc = deviceComm(host);
  if (!dc || !isFloat(out) || !dc->letterBytes())
    return false;
  dc->recvLetter(msg, view(out), out.numel(), peer, tag);
  return true;
}

void cuda::all_reduce(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "all_reduce");
  if (!dc)
    return staged(a, cpu::all_reduce);
  const Tensor &x = a.in[0], &y = a.out[0];
  CommGroup g = groupOf(a, "dp");
  checkCollective(Collective::AllReduce, a, g);
  CudaBackend &be = backendOf(a);
  copyThrough(be, x, y);
  dc->allReduce(view(y), y.numel(), reductionOf(a, "all_reduce", "sum"), g);
}

// y[o][m*n + j][i] = x_m[o][j][i] for member m.
void cuda::all_gather(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "all_gather");
  if (!dc)
    return staged(a, cpu::all_gather);
  CudaBackend &be = backendOf(a);
  CommGroup g = groupOf(a, "dp");
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::AllGather, a, g);
  if (l.copyOnly)
    return copyThrough(be, x, y);
  int64_t dim = l.dim;
  View3 v = view3(x.type.shape, dim);
  if (v.outer == 1)
    return dc->allGather(view(x), view(y), x.numel(), g);
  DView flat = flatScratch(be, x.numel() * n, 0);
  dc->allGather(view(x), flat, x.numel(), g);
  permute(flat, view(y), v.outer, n, v.mid * v.inner, false, be.stream());
}

// Member r keeps slice r along dim of the group's reduction.
void cuda::reduce_scatter(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "reduce_scatter");
  if (!dc)
    return staged(a, cpu::reduce_scatter);
  CudaBackend &be = backendOf(a);
  CommGroup g = groupOf(a, "dp");
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::ReduceScatter, a, g);
  if (l.copyOnly)
    return copyThrough(be, x, y);
  ReduceOp op = reductionOf(a, "reduce_scatter", "sum");
  int64_t dim = l.dim;
  View3 v = view3(y.type.shape, dim);
  if (v.outer == 1)
    return dc->reduceScatter(view(x), view(y), y.numel(), op, g);
  DView packed = flatScratch(be, x.numel(), 0);
  permute(view(x), packed, v.outer, n, v.mid * v.inner, true, be.stream());
  dc->reduceScatter(packed, view(y), y.numel(), op, g);
}

// x split along split_dim into n pieces, piece j to member j; y = the
// received pieces concatenated along concat_dim in member order.
void cuda::all_to_all(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "all_to_all");
  if (!dc)
    return staged(a, cpu::all_to_all);
  CudaBackend &be = backendOf(a);
  CommGroup g = groupOf(a, "dp");
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::AllToAll, a, g);
  if (l.copyOnly)
    return copyThrough(be, x, y);
  int64_t sd = l.splitDim, cd = l.concatDim;
  const Shape &piece = l.piece;
  int64_t pn = x.numel() / n;
  View3 xs = view3(x.type.shape, sd), pc = view3(piece, cd);
  DView sendBuf = flatScratch(be, x.numel(), 0);
  DView got = flatScratch(be, x.numel(), 3);
  permute(view(x), sendBuf, xs.outer, n, xs.mid / n * xs.inner, true,
          be.stream());
  dc->allToAll(sendBuf, got, pn, g);
  permute(got, view(y), pc.outer, n, pc.mid * pc.inner, false, be.stream());
}

// ep_dispatch / ep_combine (semantics in backend/cpu/ExpertComm.cpp). The
// counts come to the host (the route sizes every transfer), the payload
// moves device to device through DeviceComm::allToAllv (NCCL), and the
// regrouping between member-major and expert-major rows is one device copy
// per (member, local expert) block. Without a device all_to_allv (thread
// world on one device, mpi, bf16 storage) the CPU kernel runs staged.
namespace {

void expertComm(const KernelArgs &a, bool dispatch) {
  const char *k = dispatch ? "ep_dispatch" : "ep_combine";
  DeviceComm *dc = deviceCommOf(a, k);
  const Tensor &src = a.in[0], &dst = a.out[0];
  KernelFn cpuFn = dispatch ? cpu::ep_dispatch : cpu::ep_combine;
  if (!dc || isBf16(src) || isBf16(dst))
    return staged(a, cpuFn);
  CudaBackend &be = backendOf(a);
  Communicator &c = *a.ctx.comm;
  CommGroup g = cpu::expertGroup(a, c);
  std::vector<uint8_t> hc = toHost(be, a.in[1]);
  std::vector<int64_t> counts =
      cpu::readCounts(hostView(hc, a.in[1]), k);
  const Tensor &rowsT = dispatch ? src : dst, &capT = dispatch ? dst : src;
  int64_t h = expertRowElems(src, dst, k);
  cpu::ExpertRoute r =
      cpu::routeExperts(c, g, counts, rowsT.type.shape[0], k);
  checkExpertCapacity(k, g, c.rank(), r.recvTotal, capT.type.shape[0]);
  std::vector<int64_t> sendE(r.members), recvE(r.members);
  std::vector<uint64_t> sendB(r.members), recvB(r.members);
  for (int i = 0; i < r.members; ++i) {
    sendE[i] = (dispatch ? r.sendRows[i] : r.recvRows[i]) * h;
    recvE[i] = (dispatch ? r.recvRows[i] : r.sendRows[i]) * h;
    sendB[i] = static_cast<uint64_t>(sendE[i]) * 4;
    recvB[i] = static_cast<uint64_t>(recvE[i]) * 4;
  }
  c.agreeCounts(sendB, recvB, g);
  DView staging = flatScratch(be, r.recvTotal * h, 0);
  auto regroup = [&](bool toExpertMajor, float *expert) {
    for (int i = 0; i < r.members; ++i)
      for (int64_t e = 0; e < r.localExperts; ++e) {
        int64_t n = r.got[i * r.localExperts + e];
        if (!n)
          continue;
        float *mm = static_cast<float *>(staging.p) + r.memberMajor(i, e) * h;
        float *em = expert + r.expertMajor(i, e) * h;
        MAPP_CUDA_CHECK(cudaMemcpyAsync(toExpertMajor ? em : mm,
                                        toExpertMajor ? mm : em, n * h * 4,
                                        cudaMemcpyDeviceToDevice, be.stream()));
      }
  };
  float *out = static_cast<float *>(dst.data);
  int64_t kept = (dispatch ? r.recvTotal : r.sentTotal) * h;
  if (dispatch) {
    if (!dc->allToAllv(view(src), sendE, staging, recvE, g))
      return staged(a, cpuFn);
    regroup(true, out);
  } else {
    regroup(false, static_cast<float *>(src.data));
    if (!dc->allToAllv(staging, sendE, view(dst), recvE, g))
      return staged(a, cpuFn);
  }
  if (dst.numel() > kept)
    MAPP_CUDA_CHECK(cudaMemsetAsync(out + kept, 0,
                                    (dst.numel() - kept) * 4, be.stream()));
  if (dispatch && a.numOut > 1) {
    std::vector<uint8_t> hl = toHost(be, a.out[1]);
    Tensor lt = hostView(hl, a.out[1]);
    cpu::writeLocalCounts(lt, r, k);
    fromHost(be, hl, a.out[1]);
  }
  cpu::notePeerBytes(a, r, static_cast<uint64_t>(h) * 4, dispatch);
}

} // namespace

void cuda::ep_dispatch(const KernelArgs &a) { expertComm(a, true); }
void cuda::ep_combine(const KernelArgs &a) { expertComm(a, false); }

namespace {

/// Whether a send/recv of `t` moves its payload through the host: no device
/// communicator, not a float, or the adaptive scheduler's posted host
/// receives without letters (both ends must speak the same protocol).
bool p2pStaged(const KernelArgs &a, DeviceComm *dc, const Tensor &t) {
  return !dc || !isFloat(t) || (a.ctx.p2pThroughHost && !dc->letterBytes());
}

} // namespace

void cuda::send(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "send");
  if (p2pStaged(a, dc, a.in[0]))
    return staged(a, cpu::send);
  dc->send(view(a.in[0]), a.in[0].numel(),
           static_cast<int>(a.attrs.getInt("peer", 0)), runtimeTag(a));
}

void cuda::recv(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "recv");
  if (p2pStaged(a, dc, a.out[0]))
    return staged(a, cpu::recv);
  dc->recv(view(a.out[0]), a.out[0].numel(),
           static_cast<int>(a.attrs.getInt("peer", 0)), runtimeTag(a));
}

// Gradient buffers are final only on the step's last microbatch.
void cuda::grad_sync(const KernelArgs &a) {
  if (a.ctx.microbatch != a.ctx.numMicrobatches - 1)
    return;
  DeviceComm *dc = deviceCommOf(a, "grad_sync");
  if (!dc)
    return staged(a, cpu::grad_sync, true);
  CommGroup g = groupOf(a, "tp");
  if (g.size() == 1)
    return;
  ReduceOp op = reductionOf(a, "grad_sync", "avg");
  std::string mode = a.attrs.getStr("mode", "all_reduce");
  if (mode != "all_reduce" && mode != "reduce_scatter")
    fail("grad_sync: unknown mode '", mode, "'");
  CudaBackend &be = backendOf(a);
  int64_t n = bucketSize(a, g.size());
  if (n == 0)
    return;
  // Under NCCL the collective and the unpack run on NCCL's stream while the
  // compute stream goes on with the backward; Backend::waitComm (before the
  // gradient norm and the optimizer) joins them.
  DView flat = gradBuffer(be, *dc, a, 0, n);
  packBucket(be, a, flat, n);
  if (mode == "all_reduce") {
    cudaStream_t s = dc->startGradAllReduce(flat, n, op, g, be.stream());
    return unpackBucket(a, flat, 0, n, s);
  }
  // ZeRO-1: only this rank's slice of the bucket is reduced (cpu::grad_sync).
  int64_t chunk = n / g.size(), r = g.indexOf(a.ctx.comm->rank());
  DView mine = gradBuffer(be, *dc, a, 1, chunk);
  cudaStream_t s =
      dc->startGradReduceScatter(flat, mine, chunk, op, g, be.stream());
  unpackBucket(a, mine, r * chunk, (r + 1) * chunk, s);
}

// ZeRO-1: every member contributes its updated slice of the flat bucket.
void cuda::param_gather(const KernelArgs &a) {
  DeviceComm *dc = deviceCommOf(a, "param_gather");
  if (!dc)
    return staged(a, cpu::param_gather, true);
  CommGroup g = groupOf(a, "tp");
  if (g.size() == 1)
    return;
  CudaBackend &be = backendOf(a);
  int64_t n = bucketSize(a, g.size()), chunk = n / g.size();
  int r = g.indexOf(a.ctx.comm->rank());
  DView flat = flatScratch(be, n, 0), full = flatScratch(be, n, 3);
  packBucket(be, a, flat, n);
  dc->allGather(offsetView(flat, r * chunk), full, chunk, g);
  unpackBucket(a, full, 0, n, be.stream());
}

// Tensor-parallel cross-entropy pieces and Megatron's f / scatter: no
// communication (only the rank's group position), host-staged until they
// get device kernels.
void cuda::reduce_max(const KernelArgs &a) { staged(a, cpu::reduce_max); }
void cuda::vocab_ce_partials(const KernelArgs &a) {
  staged(a, cpu::vocab_ce_partials);
}
void cuda::vocab_ce_partials_grad(const KernelArgs &a) {
  staged(a, cpu::vocab_ce_partials_grad);
}
void cuda::ce_from_partials(const KernelArgs &a) {
  staged(a, cpu::ce_from_partials);
}
void cuda::ce_from_partials_grad(const KernelArgs &a) {
  staged(a, cpu::ce_from_partials_grad);
}
void cuda::copy_to_group(const KernelArgs &a) {
  copyThrough(backendOf(a), a.in[0], a.out[0]);
}
void cuda::scatter_to_group(const KernelArgs &a) {
  staged(a, cpu::scatter_to_group);
}

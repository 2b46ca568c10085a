//===- ContextParallel.cu - context parallelism on the CUDA backend -------===//
//
// cp_shard / cp_unshard, and cp_attention(_grad) as all-to-alls around the
// one-rank attention kernels (a2a) or as a ring of K/V blocks (the host
// kernel, or the device ring with MAPP_CUDA_CP_RING=device).
//
//===----------------------------------------------------------------------===//
#include "../CollectiveArgs.h"
#include "../cpu/CpuKernels.h"
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
using namespace mapp::rt::cuda::commk;

// Context parallelism (semantics in backend/cpu/ContextParallel.cpp,
// docs/context-parallel.md). cp_shard / cp_unshard are two strided device
// copies. cp_attention with comm = "a2a" (Ulysses) runs on the device: each
// of q, k, v (and dout) goes through one all-to-all from sequence-sharded
// [B, S/n, W] to head-sharded [B, S, W/n] — device collectives where the
// communicator has them (rank threads on one GPU, NCCL), else staged through
// the host communicator — and a reorder kernel puts the S rows (member r's
// chunks r and 2n−1−r) into global sequence order, so the one-rank
// attention kernels (cuDNN or own; GQA, causal mask and rotary at natural
// positions exactly as cp = 1 runs them) work on the rank's heads/n query
// and kv_heads/n key/value heads; the output (the gradients) goes back the
// same way. comm = "ring" runs the CPU kernel on host copies (with a
// warning), or the device ring below with MAPP_CUDA_CP_RING=device.
namespace {

/// Device memory the cp kernels of one backend keep between calls: the
/// head-sharded operands and the all-to-all staging. The addresses are
/// stable (the attention's saved forward is keyed by its operands); grown on
/// demand and kept until the process ends (outside CudaBackend.h, whose
/// every change recompiles the whole backend).
enum CpBuffer {
  kCpQ, kCpK, kCpV, kCpO, kCpDOut, kCpDQ, kCpDK, kCpDV, kCpSend, kCpGot,
  // the device ring: rotated q, the held and the incoming k|v block, their
  // dk|dv accumulators, the fp32 output / lse / dq accumulators, the
  // chunk operands of one attention call
  kRingQ, kRingKV, kRingKVNext, kRingDKV, kRingDKVNext, kRingO, kRingLse,
  kRingDQ, kRingOs, kRingQc0, kRingQc1, kRingKc, kRingVc, kRingOc, kRingDOc0,
  kRingDOc1, kRingOc0, kRingOc1, kRingDQc, kRingDKc, kRingDVc, kNumCpBuffers
};

void *cpBuffer(CudaBackend &be, int which, size_t bytes) {
  struct Slot {
    void *p = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mu;
  // Keyed by the device too: a later backend at a freed one's address may
  // sit on another GPU.
  static std::map<std::pair<const CudaBackend *, int>,
                  std::array<Slot, kNumCpBuffers>>
      all;
  Slot *s;
  {
    std::lock_guard<std::mutex> lock(mu);
    s = &all[{&be, be.device()}][which]; // map nodes stay put
  }
  bytes = std::max<size_t>(bytes, 16);
  if (s->bytes < bytes) {
    // Earlier readers (other members' all-to-all copies included: their
    // reads are ordered before this stream's later work) are done.
    MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
    MAPP_CUDA_CHECK(cudaFree(s->p));
    MAPP_CUDA_CHECK(cudaMalloc(&s->p, bytes));
    s->bytes = bytes;
  }
  return s->p;
}

int elemBytes(DView v) { return v.bf16 ? 2 : 4; }

/// One cp kernel's group and geometry: q [B, tl, h], k/v [B, tl, hk].
struct CpCall {
  CommGroup g;
  int n = 1, self = 0;
  int64_t b = 0, tl = 0, h = 0, hk = 0, heads = 0, kvHeads = 0;
};

CpCall cpCallOf(const KernelArgs &a, const Tensor &q, const Tensor &k,
                const char *kernel, bool headsSplit = true) {
  Communicator &comm = communicatorOf(a, kernel);
  CpCall c;
  c.g = cpGroupOf(a, comm, kernel);
  c.n = c.g.size();
  c.self = c.g.indexOf(comm.rank());
  c.b = q.dim(0);
  c.tl = q.dim(1);
  c.h = q.dim(2);
  c.hk = k.dim(2);
  c.heads = a.attrs.getInt("heads", 1);
  int64_t d = c.heads > 0 ? c.h / c.heads : 0;
  if (d <= 0 || d * c.heads != c.h || c.hk % d)
    fail(kernel, ": heads ", c.heads, " do not divide the widths ", c.h,
         " and ", c.hk);
  c.kvHeads = c.hk / d;
  if (c.tl % 2)
    fail(kernel, ": the sequence share ", c.tl, " must be two equal chunks");
  if (headsSplit && (c.heads % c.n || c.kvHeads % c.n))
    fail(kernel, ": comm \"a2a\" splits the heads over the cp group: ",
         c.heads, " heads and ", c.kvHeads,
         " key/value heads must be divisible by cp = ", c.n);
  return c;
}

/// Between the all-to-all's member-major rows [n][B][tl][w] (member i's
/// share: its chunks i and 2n−1−i) and [B][n·tl][w] in global sequence
/// order; toGlobal picks the direction.
__global__ void cpReorder(DView member, DView global, int64_t b, int64_t tl,
                          int n, int64_t w, int toGlobal) {
  int64_t total = n * b * tl * w, c = tl / 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t col = e % w, r = e / w, t = r % tl;
    r /= tl;
    int64_t bb = r % b, i = r / b;
    int64_t pos = t < c ? i * c + t : (2 * n - 1 - i) * c + (t - c);
    int64_t ge = (bb * n * tl + pos) * w + col;
    if (toGlobal)
      global.st(ge, member.ld(e));
    else
      member.st(e, global.ld(ge));
  }
}

void cpReorderLaunch(DView member, DView global, int64_t b, int64_t tl, int n,
                     int64_t w, bool toGlobal, cudaStream_t s) {
  int64_t total = n * b * tl * w;
  if (!total)
    return;
  cpReorder<<<gridFor(total, 256), 256, 0, s>>>(member, global, b, tl, n, w,
                                                toGlobal);
  MAPP_CUDA_LAUNCHED();
}

/// send's n blocks of `blk` elements to the members, theirs into got: on the
/// device communicator, or through host memory and the host communicator.
void cpExchange(const KernelArgs &a, DeviceComm *dc, const CommGroup &g,
                DView send, DView got, int64_t blk) {
  if (dc)
    return dc->allToAll(send, got, blk, g);
  CudaBackend &be = backendOf(a);
  size_t bytes = static_cast<size_t>(blk) * elemBytes(send);
  std::vector<uint8_t> hs(bytes * g.size()), hg(bytes * g.size());
  be.copyFromStorage(hs.data(), send.p, hs.size());
  a.ctx.comm->allToAll(hs.data(), hg.data(), bytes, g);
  MAPP_CUDA_CHECK(cudaMemcpyAsync(got.p, hg.data(), hg.size(),
                                  cudaMemcpyHostToDevice, be.stream()));
  // hg dies with this frame.
  MAPP_CUDA_CHECK(cudaStreamSynchronize(be.stream()));
}

/// x [B, tl, w] (sequence-sharded) → y [B, n·tl, w/n]: this member's column
/// block (heads) of every member's rows, in global order.
void seqToHeads(const KernelArgs &a, DeviceComm *dc, const CpCall &c, DView x,
                int64_t w, DView y) {
  CudaBackend &be = backendOf(a);
  int64_t wl = w / c.n, blk = c.b * c.tl * wl;
  DView send{cpBuffer(be, kCpSend, blk * c.n * elemBytes(x)), x.bf16};
  DView got{cpBuffer(be, kCpGot, blk * c.n * elemBytes(x)), x.bf16};
  permute(x, send, c.b * c.tl, c.n, wl, true, be.stream());
  cpExchange(a, dc, c.g, send, got, blk);
  cpReorderLaunch(got, y, c.b, c.tl, c.n, wl, true, be.stream());
}

/// The inverse: y [B, n·tl, w/n] (global order) → x [B, tl, w].
void headsToSeq(const KernelArgs &a, DeviceComm *dc, const CpCall &c, DView y,
                int64_t w, DView x) {
  CudaBackend &be = backendOf(a);
  int64_t wl = w / c.n, blk = c.b * c.tl * wl;
  DView send{cpBuffer(be, kCpSend, blk * c.n * elemBytes(y)), y.bf16};
  DView got{cpBuffer(be, kCpGot, blk * c.n * elemBytes(y)), y.bf16};
  cpReorderLaunch(send, y, c.b, c.tl, c.n, wl, false, be.stream());
  cpExchange(a, dc, c.g, send, got, blk);
  permute(got, x, c.b * c.tl, c.n, wl, false, be.stream());
}

/// A head-sharded operand in cp buffer `which`: `like`'s storage type,
/// shape [B, n·tl, w/n].
Tensor headTensor(CudaBackend &be, int which, const Tensor &like,
                  const CpCall &c) {
  Tensor t;
  t.type.dtype = like.type.dtype;
  t.type.shape = {c.b, c.n * c.tl, like.dim(2) / c.n};
  t.data = cpBuffer(be, which, t.numel() * storedSize(like));
  return t;
}

/// The attention's attributes on the local heads.
Attrs localHeadAttrs(const KernelArgs &a, const CpCall &c) {
  Attrs at = a.attrs;
  at.setInt("heads", c.heads / c.n);
  return at;
}

/// Moves a saved forward (lse and output copy) from the attention call on
/// `from` (q, k, v) to one keyed by `to`; the source is marked consumed.
/// False when `from` has none (the gradient then recomputes it).
bool moveSavedForward(CudaBackend &be, const Tensor *from, const Tensor *to,
                      int64_t rows, int64_t numel) {
  AttnSaved *src = be.findAttn(from[0].data, from[1].data, from[2].data);
  if (!src || src->rows < rows || src->numel < numel)
    return false;
  src->q = nullptr;
  AttnSaved &dst = be.attnSaved(to[0].data, rows, numel, src->oBf16);
  dst.q = to[0].data;
  dst.k = to[1].data;
  dst.v = to[2].data;
  MAPP_CUDA_CHECK(cudaMemcpyAsync(dst.lse, src->lse, rows * sizeof(float),
                                  cudaMemcpyDeviceToDevice, be.stream()));
  MAPP_CUDA_CHECK(cudaMemcpyAsync(dst.o, src->o,
                                  numel * (src->oBf16 ? 2 : 4),
                                  cudaMemcpyDeviceToDevice, be.stream()));
  return true;
}

bool deviceRing();

/// The device communicator for the device ring, or null (host-staged ring):
/// MAPP_CUDA_CP_RING=device, device collectives, k and v stored alike.
DeviceComm *ringDeviceComm(const KernelArgs &a, const Tensor &k,
                           const Tensor &v) {
  if (!deviceRing() || !a.ctx.comm || k.type.dtype != v.type.dtype)
    return nullptr;
  return backendOf(a).deviceComm(*a.ctx.comm);
}

/// comm = "ring" on the CUDA backend: said once per process, since at long
/// sequences the host attention dominates the step.
void warnRingOnHost(const KernelArgs &a) {
  if (!a.ctx.comm)
    return;
  static std::once_flag once;
  std::call_once(once, [&] {
    int n = groupOf(a, "cp").size();
    std::fprintf(stderr,
                 "mapp-run: warning: cp_attention with comm=ring runs the CPU "
                 "kernel on host copies on the CUDA backend (sequence %lld "
                 "over cp=%d): slow at long sequences; cp-comm=a2a runs on "
                 "the device\n",
                 static_cast<long long>(a.in[1].dim(1) * n), n);
  });
}

/// cp_shard / cp_unshard: member r's chunks r and 2n−1−r between the whole
/// sequence dim and the share, as two strided copies.
void moveShareDevice(const KernelArgs &a, bool toShare, KernelFn cpuFn) {
  const char *kernel = toShare ? "cp_shard" : "cp_unshard";
  const Tensor &whole = toShare ? a.in[0] : a.out[0];
  const Tensor &share = toShare ? a.out[0] : a.in[0];
  if (whole.type.dtype != share.type.dtype) // storage policies differ
    return staged(a, cpuFn);
  auto [r, n] = cpMemberOf(a, kernel);
  const Shape &ws = whole.type.shape;
  int64_t dim = a.attrs.getInt("dim", 1);
  int64_t s = cpSequenceOf(ws, dim, n, kernel);
  View3 v = view3(ws, dim);
  size_t elem = storedSize(whole), row = v.inner * elem;
  int64_t c = s / (2 * n), tl = s / n;
  CudaBackend &be = backendOf(a);
  auto *w = static_cast<char *>(whole.data);
  auto *sh = static_cast<char *>(share.data);
  if (!toShare && whole.numel())
    MAPP_CUDA_CHECK(
        cudaMemsetAsync(w, 0, whole.numel() * elem, be.stream()));
  if (!c || !v.outer || !v.inner)
    return;
  for (int64_t part = 0; part < 2; ++part) {
    int64_t chunk = part == 0 ? r : 2 * n - 1 - r;
    char *wp = w + chunk * c * row, *sp = sh + part * c * row;
    size_t wPitch = s * row, sPitch = tl * row;
    if (toShare)
      MAPP_CUDA_CHECK(cudaMemcpy2DAsync(sp, sPitch, wp, wPitch, c * row,
                                        v.outer, cudaMemcpyDeviceToDevice,
                                        be.stream()));
    else
      MAPP_CUDA_CHECK(cudaMemcpy2DAsync(wp, wPitch, sp, sPitch, c * row,
                                        v.outer, cudaMemcpyDeviceToDevice,
                                        be.stream()));
  }
}

// --- the ring on the device (MAPP_CUDA_CP_RING=device; semantics as
// cpu::cp_attention's ring). Member r's rows are chunks r and 2n−1−r of c
// rows each; the k|v block of member src holds chunks src and 2n−1−src. A
// (query chunk, key chunk) pair is entirely visible (key chunk earlier),
// entirely masked (later) or the causal diagonal (the same chunk), so each
// visible pair is one call of the one-rank attention on [B, c, ·] chunk
// copies (rotary applied beforehand at global positions, so the call runs
// without it), whose outputs and log-sum-exps merge into fp32 accumulators.
// The gradient reruns the forward ring for the merged lse and output, gives
// both to each pair's attention_grad as its saved forward (softmax against
// the whole row), sums dq locally, and sends dk|dv (fp32) around the ring
// with k|v: after n steps each block is home with its full gradient.

// MPI guarantees tags up to 32767 (the CPU ring's tags).
constexpr int64_t kCpRingTag = 32001, kCpRingGradTag = 32002;

bool deviceRing() {
  const char *e = std::getenv("MAPP_CUDA_CP_RING");
  return e && std::string(e) == "device";
}

__device__ __forceinline__ int64_t cpGlobalPos(int64_t member, int64_t t,
                                               int64_t tl, int64_t n) {
  int64_t c = tl / 2;
  return t < c ? member * c + t : (2 * n - 1 - member) * c + (t - c);
}

/// Rotary (or its inverse) of x [B, tl, width] rows of heads of d columns,
/// row t at the global position of member's row t; the first R columns of
/// each head in pairs (s, s + R/2), the rest copied; dst may be src. The
/// angles as the one-rank kernel's table computes them (double sincos).
__global__ void cpRotary(DView src, DView dst, int64_t b, int64_t tl,
                         int64_t width, int64_t d, int64_t R, double base,
                         int64_t member, int64_t n, int inverse) {
  int64_t half = R / 2, per = d - half, heads = width / d;
  int64_t total = b * tl * heads * per;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = idx % per, hrow = idx / per, first = hrow * d;
    int64_t t = (hrow / heads) % tl;
    if (s >= half) {
      dst.st(first + s + half, src.ld(first + s + half));
      continue;
    }
    double sn, cs;
    sincos(cpGlobalPos(member, t, tl, n) * ::pow(base, -2.0 * s / R), &sn, &cs);
    float c = static_cast<float>(cs), si = static_cast<float>(sn);
    if (inverse)
      si = -si;
    float x0 = src.ld(first + s), x1 = src.ld(first + s + half);
    dst.st(first + s, x0 * c - x1 * si);
    dst.st(first + s + half, x1 * c + x0 * si);
  }
}

/// Merges one call's output part [B, c, heads·d] and lse [B, heads, c] into
/// the accumulators acc [B, 2c, heads·d] (rows rowOff..rowOff+c−1) and lse.
__global__ void ringMerge(DView part, const float *lsePart, float *acc,
                          float *lse, int64_t b, int64_t c, int64_t heads,
                          int64_t d, int64_t rowOff) {
  int64_t total = b * heads * c, h = heads * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = idx % c, hd = (idx / c) % heads, bb = idx / (c * heads);
    float lp = lsePart[idx], lo = lse[idx];
    if (lp == -INFINITY)
      continue; // nothing visible
    float m = fmaxf(lo, lp);
    float wo = lo == -INFINITY ? 0.0f : expf(lo - m), wp = expf(lp - m);
    float sum = wo + wp;
    float *row = acc + (bb * 2 * c + rowOff + i) * h + hd * d;
    int64_t prow = (bb * c + i) * h + hd * d;
    for (int64_t e = 0; e < d; ++e)
      row[e] = (row[e] * wo + part.ld(prow + e) * wp) / sum;
    lse[idx] = m + logf(sum);
  }
}

/// acc [B, 2c, w] rows rowOff.. += part [B, c, w].
__global__ void ringAddInto(DView part, float *acc, int64_t b, int64_t c,
                            int64_t w, int64_t rowOff) {
  int64_t total = b * c * w;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    int64_t col = e % w, i = (e / w) % c, bb = e / (w * c);
    acc[(bb * 2 * c + rowOff + i) * w + col] += part.ld(e);
  }
}

__global__ void fillNegInf(float *x, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    x[e] = -INFINITY;
}

struct RingCall {
  CpCall c;
  int next = 0, prev = 0;
  int64_t d = 0, chunk = 0, rotDim = 0;
  double base = 10000;
  bool rotary = false, causal = false;
};

RingCall ringCallOf(const KernelArgs &a, const Tensor &q, const Tensor &k,
                    const char *kernel) {
  RingCall r;
  r.c = cpCallOf(a, q, k, kernel, false);
  const CpCall &c = r.c;
  r.next = c.g.members[(c.self + 1) % c.n];
  r.prev = c.g.members[(c.self + c.n - 1) % c.n];
  r.d = c.h / c.heads;
  r.chunk = c.tl / 2;
  r.rotary = a.attrs.flag("rotary");
  r.causal = a.attrs.flag("causal");
  r.rotDim = a.attrs.getInt("rotary_dim", r.d);
  r.base = a.attrs.getFloat("rotary_base", 10000.0);
  return r;
}

/// x [B, tl, width] rotated at this member's positions into dst (copied
/// without rotary).
void ringRotate(CudaBackend &be, const RingCall &r, DView x, DView dst,
                int64_t width, bool inverse) {
  int64_t n = r.c.b * r.c.tl * width;
  if (!r.rotary) {
    if (x.p != dst.p || x.bf16 != dst.bf16)
      copyConvert(x, dst, n, be.stream());
    return;
  }
  int64_t total = r.c.b * r.c.tl * (width / r.d) * (r.d - r.rotDim / 2);
  if (!total)
    return;
  cpRotary<<<gridFor(total, 256), 256, 0, be.stream()>>>(
      x, dst, r.c.b, r.c.tl, width, r.d, r.rotDim, r.base, r.c.self, r.c.n,
      inverse);
  MAPP_CUDA_LAUNCHED();
}

/// A [B, c, w] tensor of `like`'s storage in cp buffer `which`.
Tensor chunkTensor(CudaBackend &be, int which, DType dt, const RingCall &r,
                   int64_t w) {
  Tensor t;
  t.type.dtype = dt;
  t.type.shape = {r.c.b, r.chunk, w};
  t.data = cpBuffer(be, which, t.numel() * dtypeSize(dt));
  return t;
}

/// dst [B, c, w] = rows part·c.. of src [B, 2c, w] (same storage).
void copyChunk(CudaBackend &be, const RingCall &r, DView src, int part,
               const Tensor &dst, int64_t w) {
  size_t es = elemBytes(src), row = w * es;
  MAPP_CUDA_CHECK(cudaMemcpy2DAsync(
      dst.data, r.chunk * row, static_cast<char *>(src.p) + part * r.chunk * row,
      2 * r.chunk * row, r.chunk * row, r.c.b, cudaMemcpyDeviceToDevice,
      be.stream()));
}

/// The attrs of one chunk-pair call: rotary done, causal only on the
/// diagonal.
Attrs pairAttrs(const KernelArgs &a, bool causal) {
  Attrs at = a.attrs;
  at.setInt("rotary", 0);
  at.setInt("causal", causal ? 1 : 0);
  return at;
}

/// The member-order chunk index of part p (0: the early chunk).
int64_t chunkOf(int64_t member, int p, int64_t n) {
  return p == 0 ? member : 2 * n - 1 - member;
}

/// The forward ring over the rotated q (Q) and k|v (kv, taken over and
/// moved around); o [B, tl, H] and lse [2][B, heads, c] fp32 accumulators.
/// qc[p]: q's chunk p (filled here).
void ringForwardDevice(const KernelArgs &a, DeviceComm &dc, const RingCall &r,
                       DView q, DView kv, DType qType, DType kType, float *o,
                       float *lse, const Tensor *qc, int64_t tag) {
  CudaBackend &be = backendOf(a);
  const CpCall &c = r.c;
  int64_t nk = c.b * c.tl * c.hk, rowsC = c.b * c.heads * r.chunk;
  fillZero({o, 0}, c.b * c.tl * c.h, be.stream());
  fillNegInf<<<gridFor(2 * rowsC, 256), 256, 0, be.stream()>>>(lse, 2 * rowsC);
  MAPP_CUDA_LAUNCHED();
  for (int p = 0; p < 2; ++p)
    copyChunk(be, r, q, p, qc[p], c.h);
  DView other{cpBuffer(be, kRingKVNext, 2 * nk * elemBytes(kv)), kv.bf16};
  Tensor kc = chunkTensor(be, kRingKc, kType, r, c.hk);
  Tensor vc = chunkTensor(be, kRingVc, kType, r, c.hk);
  Tensor oc = chunkTensor(be, kRingOc, qType, r, c.h);
  Attrs diag = pairAttrs(a, true), full = pairAttrs(a, false);
  for (int s = 0; s < c.n; ++s) {
    int64_t src = (c.self - s + c.n) % c.n;
    if (s + 1 < c.n) // captured now: the block may be overwritten after
      dc.send(kv, 2 * nk, r.next, tag);
    for (int kp = 0; kp < 2; ++kp) {
      int64_t kchunk = chunkOf(src, kp, c.n);
      copyChunk(be, r, kv, kp, kc, c.hk);
      copyChunk(be, r, offsetView(kv, nk), kp, vc, c.hk);
      for (int qp = 0; qp < 2; ++qp) {
        int64_t qchunk = chunkOf(c.self, qp, c.n);
        if (r.causal && kchunk > qchunk)
          continue;
        Tensor in[3] = {qc[qp], kc, vc}, out[1] = {oc};
        cuda::attention({r.causal && kchunk == qchunk ? diag : full, in, 3,
                         out, 1, a.ctx});
        AttnSaved *sv = be.findAttn(qc[qp].data, kc.data, vc.data);
        if (!sv)
          fail("cp_attention: the chunk attention kept no statistics");
        sv->q = nullptr; // read below, then stale
        ringMerge<<<gridFor(rowsC, 256), 256, 0, be.stream()>>>(
            view(oc), sv->lse, o, lse + qp * rowsC, c.b, r.chunk, c.heads,
            r.d, qp * r.chunk);
        MAPP_CUDA_LAUNCHED();
      }
    }
    if (s + 1 < c.n) {
      dc.recv(other, 2 * nk, r.prev, tag);
      std::swap(kv, other);
    }
  }
}

/// k rotated at this member's positions and v, as one k|v block in k's
/// storage (the ring's message).
DView ringKV(CudaBackend &be, const RingCall &r, const Tensor &k,
             const Tensor &v) {
  int64_t nk = r.c.b * r.c.tl * r.c.hk;
  DView kv{cpBuffer(be, kRingKV, 2 * nk * storedSize(k)), isBf16(k)};
  ringRotate(be, r, view(k), kv, r.c.hk, false);
  copyConvert(view(v), offsetView(kv, nk), nk, be.stream());
  return kv;
}

void cpRingForward(const KernelArgs &a, DeviceComm &dc) {
  CudaBackend &be = backendOf(a);
  RingCall r = ringCallOf(a, a.in[0], a.in[1], "cp_attention");
  const CpCall &c = r.c;
  DType qt = a.in[0].type.dtype, kt = a.in[1].type.dtype;
  DView q{cpBuffer(be, kRingQ, a.in[0].numel() * storedSize(a.in[0])),
          isBf16(a.in[0])};
  ringRotate(be, r, view(a.in[0]), q, c.h, false);
  DView kv = ringKV(be, r, a.in[1], a.in[2]);
  auto *o = static_cast<float *>(cpBuffer(be, kRingO, c.b * c.tl * c.h * 4));
  auto *lse = static_cast<float *>(
      cpBuffer(be, kRingLse, 2 * c.b * c.heads * r.chunk * 4));
  Tensor qc[2] = {chunkTensor(be, kRingQc0, qt, r, c.h),
                  chunkTensor(be, kRingQc1, qt, r, c.h)};
  ringForwardDevice(a, dc, r, q, kv, qt, kt, o, lse, qc, kCpRingTag);
  copyConvert({o, 0}, view(a.out[0]), a.out[0].numel(), be.stream());
}

void cpRingBackward(const KernelArgs &a, DeviceComm &dc) {
  CudaBackend &be = backendOf(a);
  const Tensor &dout = a.in[0];
  RingCall r = ringCallOf(a, a.in[1], a.in[2], "cp_attention_grad");
  const CpCall &c = r.c;
  DType qt = a.in[1].type.dtype, kt = a.in[2].type.dtype;
  int64_t nk = c.b * c.tl * c.hk, nq = c.b * c.tl * c.h;
  int64_t rowsC = c.b * c.heads * r.chunk;
  DView q{cpBuffer(be, kRingQ, nq * storedSize(a.in[1])), isBf16(a.in[1])};
  ringRotate(be, r, view(a.in[1]), q, c.h, false);
  DView kv = ringKV(be, r, a.in[2], a.in[3]);
  auto *o = static_cast<float *>(cpBuffer(be, kRingO, nq * 4));
  auto *lse = static_cast<float *>(cpBuffer(be, kRingLse, 2 * rowsC * 4));
  Tensor qc[2] = {chunkTensor(be, kRingQc0, qt, r, c.h),
                  chunkTensor(be, kRingQc1, qt, r, c.h)};
  // The forward again: the merged output and lse of every query row. It
  // leaves another member's block in the buffers: this one's is rebuilt.
  ringForwardDevice(a, dc, r, q, kv, qt, kt, o, lse, qc, kCpRingGradTag);
  kv = ringKV(be, r, a.in[2], a.in[3]);
  // The output chunks in q's storage and dout's chunks, for the pair calls.
  DView os{cpBuffer(be, kRingOs, nq * storedSize(a.in[1])), isBf16(a.in[1])};
  copyConvert({o, 0}, os, nq, be.stream());
  Tensor oc[2] = {chunkTensor(be, kRingOc0, qt, r, c.h),
                  chunkTensor(be, kRingOc1, qt, r, c.h)};
  Tensor doc[2] = {chunkTensor(be, kRingDOc0, dout.type.dtype, r, c.h),
                   chunkTensor(be, kRingDOc1, dout.type.dtype, r, c.h)};
  for (int p = 0; p < 2; ++p) {
    copyChunk(be, r, os, p, oc[p], c.h);
    copyChunk(be, r, view(dout), p, doc[p], c.h);
  }
  auto *dq = static_cast<float *>(cpBuffer(be, kRingDQ, nq * 4));
  DView dkv{cpBuffer(be, kRingDKV, 2 * nk * 4), 0};
  DView dkvOther{cpBuffer(be, kRingDKVNext, 2 * nk * 4), 0};
  DView kvOther{cpBuffer(be, kRingKVNext, 2 * nk * elemBytes(kv)), kv.bf16};
  fillZero({dq, 0}, nq, be.stream());
  fillZero(dkv, 2 * nk, be.stream());
  Tensor kc = chunkTensor(be, kRingKc, kt, r, c.hk);
  Tensor vc = chunkTensor(be, kRingVc, kt, r, c.hk);
  Tensor dqc = chunkTensor(be, kRingDQc, a.out[0].type.dtype, r, c.h);
  Tensor dkc = chunkTensor(be, kRingDKc, a.out[1].type.dtype, r, c.hk);
  Tensor dvc = chunkTensor(be, kRingDVc, a.out[2].type.dtype, r, c.hk);
  Attrs diag = pairAttrs(a, true), full = pairAttrs(a, false);
  int64_t nc = c.b * r.chunk;
  for (int s = 0; s < c.n; ++s) {
    int64_t src = (c.self - s + c.n) % c.n;
    for (int kp = 0; kp < 2; ++kp) {
      int64_t kchunk = chunkOf(src, kp, c.n);
      copyChunk(be, r, kv, kp, kc, c.hk);
      copyChunk(be, r, offsetView(kv, nk), kp, vc, c.hk);
      for (int qp = 0; qp < 2; ++qp) {
        int64_t qchunk = chunkOf(c.self, qp, c.n);
        if (r.causal && kchunk > qchunk)
          continue;
        // The saved forward of this pair: the whole row's lse and output.
        AttnSaved &sv = be.attnSaved(qc[qp].data, rowsC, nc * c.h,
                                     isBf16(oc[qp]));
        sv.q = qc[qp].data;
        sv.k = kc.data;
        sv.v = vc.data;
        MAPP_CUDA_CHECK(cudaMemcpyAsync(sv.lse, lse + qp * rowsC, rowsC * 4,
                                        cudaMemcpyDeviceToDevice, be.stream()));
        MAPP_CUDA_CHECK(cudaMemcpyAsync(sv.o, oc[qp].data,
                                        nc * c.h * storedSize(oc[qp]),
                                        cudaMemcpyDeviceToDevice, be.stream()));
        Tensor in[4] = {doc[qp], qc[qp], kc, vc}, out[3] = {dqc, dkc, dvc};
        cuda::attention_grad({r.causal && kchunk == qchunk ? diag : full, in,
                              4, out, 3, a.ctx});
        struct {
          DView part;
          float *acc;
          int64_t w, rowOff;
        } adds[3] = {{view(dqc), dq, c.h, qp * r.chunk},
                     {view(dkc), static_cast<float *>(dkv.p), c.hk, kp * r.chunk},
                     {view(dvc), static_cast<float *>(dkv.p) + nk, c.hk,
                      kp * r.chunk}};
        for (auto &x : adds) {
          ringAddInto<<<gridFor(nc * x.w, 256), 256, 0, be.stream()>>>(
              x.part, x.acc, c.b, r.chunk, x.w, x.rowOff);
          MAPP_CUDA_LAUNCHED();
        }
      }
    }
    if (c.n == 1)
      break;
    // k|v and its dk|dv move on together; n moves bring each block home.
    dc.send(kv, 2 * nk, r.next, kCpRingGradTag);
    dc.send(dkv, 2 * nk, r.next, kCpRingGradTag);
    dc.recv(kvOther, 2 * nk, r.prev, kCpRingGradTag);
    dc.recv(dkvOther, 2 * nk, r.prev, kCpRingGradTag);
    std::swap(kv, kvOther);
    std::swap(dkv, dkvOther);
  }
  // The rotation is orthogonal: its gradient is the inverse rotation.
  ringRotate(be, r, {dq, 0}, view(a.out[0]), c.h, true);
  ringRotate(be, r, dkv, view(a.out[1]), c.hk, true);
  copyConvert(offsetView(dkv, nk), view(a.out[2]), nk, be.stream());
}

} // namespace

void cuda::cp_shard(const KernelArgs &a) {
  moveShareDevice(a, true, cpu::cp_shard);
}
void cuda::cp_unshard(const KernelArgs &a) {
  moveShareDevice(a, false, cpu::cp_unshard);
}

void cuda::cp_attention(const KernelArgs &a) {
  const char *k = "cp_attention";
  std::string comm = a.attrs.getStr("comm", "ring");
  if (comm != "a2a") {
    if (comm == "ring")
      if (DeviceComm *dc = ringDeviceComm(a, a.in[1], a.in[2]))
        return cpRingForward(a, *dc);
    if (comm == "ring")
      warnRingOnHost(a);
    return staged(a, cpu::cp_attention);
  }
  CpCall c = cpCallOf(a, a.in[0], a.in[1], k);
  CudaBackend &be = backendOf(a);
  DeviceComm *dc = be.deviceComm(*a.ctx.comm);
  Tensor in[3] = {headTensor(be, kCpQ, a.in[0], c),
                  headTensor(be, kCpK, a.in[1], c),
                  headTensor(be, kCpV, a.in[2], c)};
  Tensor out[1] = {headTensor(be, kCpO, a.out[0], c)};
  for (int i = 0; i < 3; ++i)
    seqToHeads(a, dc, c, view(a.in[i]), a.in[i].dim(2), view(in[i]));
  Attrs at = localHeadAttrs(a, c);
  cuda::attention({at, in, 3, out, 1, a.ctx});
  // The forward's statistics for the gradient, under this op's own operands
  // (the head-sharded buffers are reused by the next layer).
  moveSavedForward(be, in, a.in, c.b * (c.heads / c.n) * c.n * c.tl,
                   out[0].numel());
  headsToSeq(a, dc, c, view(out[0]), a.out[0].dim(2), view(a.out[0]));
}

void cuda::cp_attention_grad(const KernelArgs &a) {
  const char *k = "cp_attention_grad";
  std::string comm = a.attrs.getStr("comm", "ring");
  if (comm != "a2a") {
    if (comm == "ring")
      if (DeviceComm *dc = ringDeviceComm(a, a.in[2], a.in[3]))
        return cpRingBackward(a, *dc);
    if (comm == "ring")
      warnRingOnHost(a);
    return staged(a, cpu::cp_attention_grad);
  }
  CpCall c = cpCallOf(a, a.in[1], a.in[2], k);
  CudaBackend &be = backendOf(a);
  DeviceComm *dc = be.deviceComm(*a.ctx.comm);
  Tensor in[4] = {headTensor(be, kCpDOut, a.in[0], c),
                  headTensor(be, kCpQ, a.in[1], c),
                  headTensor(be, kCpK, a.in[2], c),
                  headTensor(be, kCpV, a.in[3], c)};
  Tensor out[3] = {headTensor(be, kCpDQ, a.out[0], c),
                   headTensor(be, kCpDK, a.out[1], c),
                   headTensor(be, kCpDV, a.out[2], c)};
  for (int i = 0; i < 4; ++i)
    seqToHeads(a, dc, c, view(a.in[i]), a.in[i].dim(2), view(in[i]));
  if (!moveSavedForward(be, a.in + 1, in + 1,
                        c.b * (c.heads / c.n) * c.n * c.tl, in[1].numel()))
    // No saved forward: an older one on these buffers must not be read.
    if (AttnSaved *stale = be.findAttn(in[1].data, in[2].data, in[3].data))
      stale->q = nullptr;
  Attrs at = localHeadAttrs(a, c);
  cuda::attention_grad({at, in, 4, out, 3, a.ctx});
  for (int i = 0; i < 3; ++i)
    headsToSeq(a, dc, c, view(out[i]), a.out[i].dim(2), view(a.out[i]));
}

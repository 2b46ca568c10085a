//===- ExpertComm.cpp - expert-parallel dispatch and combine (CPU) --------===//
//
// ep_dispatch(x [N, ...], counts [E]) -> y [C, ...] (, local_counts [E/n])
//   x: this rank's token rows sorted by global expert, counts[e] rows for
//   expert e (sum <= N; rows past the sum are padding). Member j of the
//   group owns experts [j*E/n, (j+1)*E/n), so its block of x is contiguous
//   and goes out as it is (all_to_allv). y: the rows every member routed to
//   this rank's experts, grouped by local expert, source member minor; rows
//   past the total are zero. C must hold the total (dropless worst case:
//   n * N).
// ep_combine(y [C, ...], counts [E]) -> x [N, ...]: the inverse (expert
//   outputs back to the ranks and rows they came from); rows of x past
//   sum(counts) are zero. ep_combine is dispatch's adjoint and vice versa,
//   so each is the other's gradient.
//
//===----------------------------------------------------------------------===//
#include "../CollectiveArgs.h"
#include "CpuKernels.h"
#include "ExpertRoute.h"
#include "mapp/rt/Error.h"

#include <cmath>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

int64_t ExpertRoute::memberMajor(int i, int64_t e) const {
  int64_t off = 0;
  for (int k = 0; k < i; ++k)
    off += recvRows[k];
  for (int64_t k = 0; k < e; ++k)
    off += got[i * localExperts + k];
  return off;
}

int64_t ExpertRoute::expertMajor(int i, int64_t e) const {
  int64_t off = 0;
  for (int64_t k = 0; k < e; ++k)
    off += localCounts[k];
  for (int k = 0; k < i; ++k)
    off += got[k * localExperts + e];
  return off;
}

std::vector<int64_t> cpu::readCounts(const Tensor &t, const char *kernel) {
  std::vector<int64_t> c(static_cast<size_t>(t.numel()));
  for (size_t e = 0; e < c.size(); ++e) {
    double v;
    switch (t.type.dtype) {
    case DType::I32:
      v = static_cast<const int32_t *>(t.data)[e];
      break;
    case DType::I64:
      v = static_cast<double>(static_cast<const int64_t *>(t.data)[e]);
      break;
    case DType::F32:
      v = static_cast<const float *>(t.data)[e];
      break;
    default:
      fail(kernel, ": counts must be f32, i32 or i64, got ",
           dtypeName(t.type.dtype));
    }
    if (!(v >= 0) || v != std::floor(v))
      fail(kernel, ": counts[", e, "] = ", v,
           " is not a row count (a non-negative integer)");
    c[e] = static_cast<int64_t>(v);
  }
  return c;
}

CommGroup cpu::expertGroup(const KernelArgs &a, Communicator &c) {
  CommGroup g = kernelGroupOf(a, c, "ep");
  // The compiler's group size (the op's `members`) must be the plan's.
  if (a.attrs.has("members") && a.attrs.getInt("members", 0) != g.size())
    fail("expert group ", g.str(), " has ", g.size(),
         " members, the op was compiled for ", a.attrs.getInt("members", 0),
         " (the plan's ep does not match the pass's)");
  return g;
}

ExpertRoute cpu::routeExperts(Communicator &c, const CommGroup &g,
                              const std::vector<int64_t> &counts,
                              int64_t rows, const char *kernel) {
  ExpertRoute r;
  r.members = g.size();
  r.self = g.indexOf(c.rank());
  if (r.self < 0)
    fail(kernel, " over ", g.str(), ": rank ", c.rank(), " is not a member");
  r.experts = static_cast<int64_t>(counts.size());
  if (r.experts == 0 || r.experts % r.members)
    fail(kernel, " over ", g.str(), ": ", r.experts,
         " experts cannot be split evenly over ", r.members,
         " members (num_moe_experts must be divisible by ep)");
  r.localExperts = r.experts / r.members;
  int64_t total = 0;
  for (int64_t v : counts)
    total += v;
  if (total > rows)
    fail(kernel, " over ", g.str(), " (rank ", c.rank(), "): counts add up to ",
         total, " rows, x has ", rows);
  r.sentTotal = total;
  r.sendRows.assign(r.members, 0);
  for (int j = 0; j < r.members; ++j)
    for (int64_t e = 0; e < r.localExperts; ++e)
      r.sendRows[j] += counts[j * r.localExperts + e];
  // Per-expert counts to their owners: block j of `counts` is member j's.
  std::vector<int64_t> got(counts.size());
  if (r.members == 1)
    got = counts;
  else
    c.allToAll(counts.data(), got.data(),
               static_cast<size_t>(r.localExperts) * sizeof(int64_t), g);
  r.got = got;
  r.recvRows.assign(r.members, 0);
  r.localCounts.assign(r.localExperts, 0);
  for (int i = 0; i < r.members; ++i)
    for (int64_t e = 0; e < r.localExperts; ++e) {
      int64_t v = got[i * r.localExperts + e];
      if (v < 0)
        fail(kernel, " over ", g.str(), ": rank ", g.members[i],
             " sends a negative count");
      r.recvRows[i] += v;
      r.localCounts[e] += v;
      r.recvTotal += v;
    }
  return r;
}

void cpu::notePeerBytes(const KernelArgs &a, const ExpertRoute &r,
                        uint64_t rowBytes, bool forward) {
  if (!a.ctx.peerBytes)
    return;
  PeerBytes &p = *a.ctx.peerBytes;
  p.send.assign(r.members, 0);
  p.recv.assign(r.members, 0);
  for (int i = 0; i < r.members; ++i) {
    uint64_t out = static_cast<uint64_t>(r.sendRows[i]) * rowBytes,
             in = static_cast<uint64_t>(r.recvRows[i]) * rowBytes;
    p.send[i] = forward ? out : in;
    p.recv[i] = forward ? in : out;
  }
}

void cpu::writeLocalCounts(Tensor &t, const ExpertRoute &r,
                           const char *kernel) {
  if (t.numel() != r.localExperts)
    fail(kernel, ": local_counts has ", t.numel(), " elements, ",
         r.localExperts, " local experts");
  for (int64_t e = 0; e < r.localExperts; ++e) {
    if (t.type.dtype == DType::I32)
      static_cast<int32_t *>(t.data)[e] = static_cast<int32_t>(r.localCounts[e]);
    else if (t.type.dtype == DType::I64)
      static_cast<int64_t *>(t.data)[e] = r.localCounts[e];
    else
      static_cast<float *>(t.data)[e] = static_cast<float>(r.localCounts[e]);
  }
}

namespace {

std::vector<uint64_t> bytesOf(const std::vector<int64_t> &rows,
                              uint64_t rowBytes) {
  std::vector<uint64_t> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i)
    b[i] = static_cast<uint64_t>(rows[i]) * rowBytes;
  return b;
}

} // namespace

void cpu::ep_dispatch(const KernelArgs &a) {
  const char *k = "ep_dispatch";
  Communicator &c = communicatorOf(a, k);
  const Tensor &x = a.in[0], &y = a.out[0];
  int64_t h = expertRowElems(x, y, k);
  CommGroup g = expertGroup(a, c);
  ExpertRoute r =
      routeExperts(c, g, readCounts(a.in[1], k), x.type.shape[0], k);
  checkExpertCapacity(k, g, c.rank(), r.recvTotal, y.type.shape[0]);
  uint64_t rowBytes = static_cast<uint64_t>(h) * sizeof(float);
  std::vector<float> got(static_cast<size_t>(std::max<int64_t>(r.recvTotal, 1) * h));
  c.allToAllv(x.data, bytesOf(r.sendRows, rowBytes), got.data(),
              bytesOf(r.recvRows, rowBytes), g);
  float *yo = y.f32();
  for (int i = 0; i < r.members; ++i)
    for (int64_t e = 0; e < r.localExperts; ++e) {
      int64_t n = r.got[i * r.localExperts + e];
      if (n)
        std::memcpy(yo + r.expertMajor(i, e) * h,
                    got.data() + r.memberMajor(i, e) * h, n * rowBytes);
    }
  std::memset(yo + r.recvTotal * h, 0,
              (y.numel() - r.recvTotal * h) * sizeof(float));
  if (a.numOut > 1)
    writeLocalCounts(a.out[1], r, k);
  notePeerBytes(a, r, rowBytes, true);
}

void cpu::ep_combine(const KernelArgs &a) {
  const char *k = "ep_combine";
  Communicator &c = communicatorOf(a, k);
  const Tensor &y = a.in[0], &x = a.out[0];
  int64_t h = expertRowElems(y, x, k);
  CommGroup g = expertGroup(a, c);
  ExpertRoute r =
      routeExperts(c, g, readCounts(a.in[1], k), x.type.shape[0], k);
  checkExpertCapacity(k, g, c.rank(), r.recvTotal, y.type.shape[0]);
  uint64_t rowBytes = static_cast<uint64_t>(h) * sizeof(float);
  std::vector<float> back(static_cast<size_t>(std::max<int64_t>(r.recvTotal, 1) * h));
  const float *yi = y.f32();
  for (int i = 0; i < r.members; ++i)
    for (int64_t e = 0; e < r.localExperts; ++e) {
      int64_t n = r.got[i * r.localExperts + e];
      if (n)
        std::memcpy(back.data() + r.memberMajor(i, e) * h,
                    yi + r.expertMajor(i, e) * h, n * rowBytes);
    }
  float *xo = x.f32();
  c.allToAllv(back.data(), bytesOf(r.recvRows, rowBytes), xo,
              bytesOf(r.sendRows, rowBytes), g);
  std::memset(xo + r.sentTotal * h, 0,
              (x.numel() - r.sentTotal * h) * sizeof(float));
  notePeerBytes(a, r, rowBytes, false);
}

//===- CommKernels.cpp - communication kernels over the Communicator ------===//
//
// Kernels stay backend-side so a device backend can stage buffers; the
// Communicator moves flat blocks. The kernels add the tensor layouts:
// gathering / scattering along any dim (packing into member-major blocks),
// all_to_all's split and concat dims, and the wire tag of send/recv.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "../CollectiveArgs.h"
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cstring>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

CommGroup groupOf(const KernelArgs &a, Communicator &c) {
  return kernelGroupOf(a, c, "dp");
}

void copyThrough(const KernelArgs &a) {
  if (a.out[0].data != a.in[0].data)
    std::memmove(a.out[0].data, a.in[0].data, a.in[0].numel() * sizeof(float));
}

/// A tensor seen as [outer, shape[dim], inner].
struct View3 {
  int64_t outer = 1, mid = 1, inner = 1;
};
View3 view3(const Tensor &t, int64_t dim) {
  View3 v;
  int r = t.rank();
  for (int i = 0; i < r; ++i) {
    int64_t d = t.type.shape[i];
    if (i < dim)
      v.outer *= d;
    else if (i == dim)
      v.mid = d;
    else
      v.inner *= d;
  }
  return v;
}



} // namespace

void cpu::all_reduce(const KernelArgs &a) {
  Communicator &c = communicatorOf(a, "all_reduce");
  ReduceOp op = reductionOf(a, "all_reduce", "sum");
  CommGroup g = groupOf(a, c);
  checkCollective(Collective::AllReduce, a, g);
  copyThrough(a);
  c.allReduce(a.out[0].f32(), a.out[0].numel(), op, g);
}

// y[o][g*n + j][i] = x_g[o][j][i] for member g.
void cpu::all_gather(const KernelArgs &a) {
  Communicator &c = communicatorOf(a, "all_gather");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::AllGather, a, g);
  if (l.copyOnly)
    return copyThrough(a);
  int64_t dim = l.dim;
  View3 v = view3(x, dim);
  if (v.outer == 1)
    return c.allGather(x.f32(), y.f32(), x.numel(), g);
  std::vector<float> flat(static_cast<size_t>(x.numel()) * n);
  c.allGather(x.f32(), flat.data(), x.numel(), g);
  int64_t block = v.mid * v.inner;
  for (int m = 0; m < n; ++m)
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(y.f32() + (o * n + m) * block,
                  flat.data() + (m * v.outer + o) * block,
                  block * sizeof(float));
}

// Member r keeps slice r along dim of the group's reduction.
void cpu::reduce_scatter(const KernelArgs &a) {
  Communicator &c = communicatorOf(a, "reduce_scatter");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::ReduceScatter, a, g);
  if (l.copyOnly)
    return copyThrough(a);
  ReduceOp op = reductionOf(a, "reduce_scatter", "sum");
  int64_t dim = l.dim;
  View3 v = view3(y, dim);
  if (v.outer == 1)
    return c.reduceScatter(x.f32(), y.f32(), y.numel(), op, g);
  int64_t block = v.mid * v.inner;
  std::vector<float> packed(static_cast<size_t>(x.numel()));
  for (int m = 0; m < n; ++m)
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(packed.data() + (m * v.outer + o) * block,
                  x.f32() + (o * n + m) * block, block * sizeof(float));
  c.reduceScatter(packed.data(), y.f32(), y.numel(), op, g);
}

// x split along split_dim into n pieces, piece j to member j; y = the
// received pieces concatenated along concat_dim in member order.
void cpu::all_to_all(const KernelArgs &a) {
  Communicator &c = communicatorOf(a, "all_to_all");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  CollectiveLayout l = checkCollective(Collective::AllToAll, a, g);
  if (l.copyOnly)
    return copyThrough(a);
  int64_t sd = l.splitDim, cd = l.concatDim;
  const Shape &piece = l.piece;
  int64_t pn = x.numel() / n;
  std::vector<float> send(static_cast<size_t>(x.numel())),
      got(static_cast<size_t>(x.numel()));
  View3 xs = view3(x, sd);
  int64_t pm = xs.mid / n, pb = pm * xs.inner;
  for (int m = 0; m < n; ++m)
    for (int64_t o = 0; o < xs.outer; ++o)
      std::memcpy(send.data() + m * pn + o * pb,
                  x.f32() + (o * xs.mid + m * pm) * xs.inner,
                  pb * sizeof(float));
  c.allToAll(send.data(), got.data(), pn * sizeof(float), g);
  Tensor pt{nullptr, TensorType{x.type.dtype, piece}};
  View3 pc = view3(pt, cd);
  int64_t cb = pc.mid * pc.inner;
  for (int m = 0; m < n; ++m)
    for (int64_t o = 0; o < pc.outer; ++o)
      std::memcpy(y.f32() + (o * n + m) * cb, got.data() + m * pn + o * cb,
                  cb * sizeof(float));
}

namespace {
int64_t runtimeTag(const KernelArgs &a) {
  return a.attrs.getInt("tag", 0) * a.ctx.numMicrobatches + a.ctx.microbatch;
}
} // namespace

void cpu::send(const KernelArgs &a) {
  communicatorOf(a, "send").send(a.in[0].data,
                         a.in[0].numel() * dtypeSize(a.in[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         runtimeTag(a));
}

void cpu::recv(const KernelArgs &a) {
  communicatorOf(a, "recv").recv(a.out[0].data,
                         a.out[0].numel() * dtypeSize(a.out[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         runtimeTag(a));
}

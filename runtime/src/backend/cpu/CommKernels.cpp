//===- CommKernels.cpp - communication kernels over the Communicator ------===//
//
// Kernels stay backend-side so a device backend can stage buffers; the
// Communicator moves flat blocks. The kernels add the tensor layouts:
// gathering / scattering along any dim (packing into member-major blocks),
// all_to_all's split and concat dims, and the wire tag of send/recv.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cstring>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

Communicator &commOf(const KernelArgs &a, const char *kernel) {
  if (!a.ctx.comm)
    fail(kernel, ": no communicator attached");
  return *a.ctx.comm;
}

CommGroup groupOf(const KernelArgs &a, Communicator &c) {
  std::vector<int64_t> ranks;
  if (a.attrs.has("ranks"))
    ranks = a.attrs.getInts("ranks");
  return resolveGroup(c, a.attrs.getStr("group", "dp"), ranks);
}

ReduceOp reductionOf(const KernelArgs &a, const char *kernel) {
  std::string red = a.attrs.getStr("reduction", "sum");
  ReduceOp op;
  if (!parseReduceOp(red, op))
    fail(kernel, ": unknown reduction '", red, "'");
  return op;
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

int64_t cpu::dimAttr(const KernelArgs &a, const char *key, const Tensor &t,
                const char *kernel) {
  int64_t d = a.attrs.getInt(key, 0);
  int r = t.rank();
  if (d < 0)
    d += r;
  if (d < 0 || d >= std::max(r, 1))
    fail(kernel, ": ", key, " ", a.attrs.getInt(key, 0), " out of range for rank ",
         r);
  return d;
}

void cpu::wantScaled(const Tensor &x, const Tensor &y, int64_t dim, int64_t num,
                int64_t den, const char *kernel, const CommGroup &g) {
  Shape want = x.type.shape;
  if (want.empty() || want[dim] * num % den != 0)
    fail(kernel, ": x shape ", shapeStr(x.type.shape),
         " cannot be split over ", g.str());
  want[dim] = want[dim] * num / den;
  if (y.type.shape != want)
    fail(kernel, " over ", g.str(), ": y has shape ", shapeStr(y.type.shape),
         ", expected ", shapeStr(want));
}

void cpu::all_reduce(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_reduce");
  ReduceOp op = reductionOf(a, "all_reduce");
  if (a.in[0].numel() != a.out[0].numel())
    fail("all_reduce: x and y differ in element count");
  copyThrough(a);
  c.allReduce(a.out[0].f32(), a.out[0].numel(), op, groupOf(a, c));
}

// y[o][g*n + j][i] = x_g[o][j][i] for member g.
void cpu::all_gather(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_gather");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  if (n == 1) {
    if (x.numel() != y.numel())
      fail("all_gather: a single-rank group keeps the element count");
    return copyThrough(a);
  }
  int64_t dim = dimAttr(a, "dim", x, "all_gather");
  wantScaled(x, y, dim, n, 1, "all_gather", g);
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
  Communicator &c = commOf(a, "reduce_scatter");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  if (n == 1) {
    if (x.numel() != y.numel())
      fail("reduce_scatter: a single-rank group keeps the element count");
    return copyThrough(a);
  }
  ReduceOp op = reductionOf(a, "reduce_scatter");
  int64_t dim = dimAttr(a, "dim", x, "reduce_scatter");
  wantScaled(x, y, dim, 1, n, "reduce_scatter", g);
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
  Communicator &c = commOf(a, "all_to_all");
  CommGroup g = groupOf(a, c);
  int n = g.size();
  const Tensor &x = a.in[0], &y = a.out[0];
  if (n == 1) {
    if (x.numel() != y.numel())
      fail("all_to_all: a single-rank group keeps the element count");
    return copyThrough(a);
  }
  int64_t sd = dimAttr(a, "split_dim", x, "all_to_all");
  int64_t cd = dimAttr(a, "concat_dim", x, "all_to_all");
  Shape piece = x.type.shape;
  if (piece.empty() || piece[sd] % n)
    fail("all_to_all: split_dim of ", shapeStr(x.type.shape),
         " is not divisible by ", n);
  piece[sd] /= n;
  Shape want = piece;
  want[cd] *= n;
  if (y.type.shape != want)
    fail("all_to_all over ", g.str(), ": y has shape ", shapeStr(y.type.shape),
         ", expected ", shapeStr(want));
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
  commOf(a, "send").send(a.in[0].data,
                         a.in[0].numel() * dtypeSize(a.in[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         runtimeTag(a));
}

void cpu::recv(const KernelArgs &a) {
  commOf(a, "recv").recv(a.out[0].data,
                         a.out[0].numel() * dtypeSize(a.out[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         runtimeTag(a));
}

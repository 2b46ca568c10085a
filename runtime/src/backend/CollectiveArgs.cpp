//===- CollectiveArgs.cpp - A collective kernel's arguments, checked once -===//

#include "CollectiveArgs.h"

#include "mapp/rt/Error.h"

#include <algorithm>

using namespace mapp::rt;

Communicator &mapp::rt::communicatorOf(const KernelArgs &a,
                                       const char *kernel) {
  if (!a.ctx.comm)
    fail(kernel, ": no communicator attached");
  return *a.ctx.comm;
}

CommGroup mapp::rt::kernelGroupOf(const KernelArgs &a, Communicator &c,
                                  const char *defaultGroup) {
  std::vector<int64_t> ranks;
  if (a.attrs.has("ranks"))
    ranks = a.attrs.getInts("ranks");
  return resolveGroup(c, a.attrs.getStr("group", defaultGroup), ranks);
}

ReduceOp mapp::rt::reductionOf(const KernelArgs &a, const char *kernel,
                               const char *dflt) {
  std::string red = a.attrs.getStr("reduction", dflt);
  ReduceOp op;
  if (!parseReduceOp(red, op))
    fail(kernel, ": unknown reduction '", red, "'");
  return op;
}

int64_t mapp::rt::dimAttr(const KernelArgs &a, const char *key,
                          const Tensor &t, const char *kernel) {
  int64_t d = a.attrs.getInt(key, 0);
  int r = t.rank();
  if (d < 0)
    d += r;
  if (d < 0 || d >= std::max(r, 1))
    fail(kernel, ": ", key, " ", a.attrs.getInt(key, 0),
         " out of range for rank ", r);
  return d;
}

void mapp::rt::wantScaled(const Tensor &x, const Tensor &y, int64_t dim,
                          int64_t num, int64_t den, const char *kernel,
                          const CommGroup &g) {
  Shape want = x.type.shape;
  if (want.empty() || want[dim] * num % den != 0)
    fail(kernel, ": x shape ", shapeStr(x.type.shape),
         " cannot be split over ", g.str());
  want[dim] = want[dim] * num / den;
  if (y.type.shape != want)
    fail(kernel, " over ", g.str(), ": y has shape ", shapeStr(y.type.shape),
         ", expected ", shapeStr(want));
}

CollectiveLayout mapp::rt::checkCollective(Collective c, const KernelArgs &a,
                                           const CommGroup &g) {
  static const char *const names[] = {"all_reduce", "all_gather",
                                      "reduce_scatter", "all_to_all"};
  const char *kernel = names[static_cast<int>(c)];
  const Tensor &x = a.in[0], &y = a.out[0];
  const int n = g.size();
  CollectiveLayout l;
  if (c == Collective::AllReduce || n == 1) {
    if (x.numel() != y.numel())
      fail(kernel, c == Collective::AllReduce
                       ? ": x and y differ in element count"
                       : ": a single-rank group keeps the element count");
    l.copyOnly = true;
    return l;
  }
  if (c != Collective::AllToAll) {
    bool gather = c == Collective::AllGather;
    l.dim = dimAttr(a, "dim", x, kernel);
    wantScaled(x, y, l.dim, gather ? n : 1, gather ? 1 : n, kernel, g);
    return l;
  }
  l.splitDim = dimAttr(a, "split_dim", x, kernel);
  l.concatDim = dimAttr(a, "concat_dim", x, kernel);
  l.piece = x.type.shape;
  if (l.piece.empty() || l.piece[l.splitDim] % n)
    fail(kernel, ": split_dim of ", shapeStr(x.type.shape),
         " is not divisible by ", n);
  l.piece[l.splitDim] /= n;
  Shape want = l.piece;
  want[l.concatDim] *= n;
  if (y.type.shape != want)
    fail(kernel, " over ", g.str(), ": y has shape ", shapeStr(y.type.shape),
         ", expected ", shapeStr(want));
  return l;
}

CommGroup mapp::rt::cpGroupOf(const KernelArgs &a, Communicator &c,
                              const char *kernel) {
  CommGroup g = kernelGroupOf(a, c, "cp");
  int64_t members = a.attrs.getInt("members", g.size());
  if (members != g.size())
    fail(kernel, ": the cp group ", g.str(), " has ", g.size(),
         " members, the op was compiled for ", members,
         " (the plan's cp does not match the pass's)");
  if (g.indexOf(c.rank()) < 0)
    fail(kernel, ": rank ", c.rank(), " is not in its cp group ", g.str());
  return g;
}

std::pair<int64_t, int64_t> mapp::rt::cpMemberOf(const KernelArgs &a,
                                                 const char *kernel) {
  int64_t members = a.attrs.getInt("members", 1);
  if (!a.ctx.comm) {
    if (members != 1)
      fail(kernel, ": members = ", members, " needs a communicator");
    return {0, 1};
  }
  CommGroup g = cpGroupOf(a, *a.ctx.comm, kernel);
  return {g.indexOf(a.ctx.comm->rank()), g.size()};
}

int64_t mapp::rt::cpSequenceOf(const Shape &whole, int64_t dim,
                               int64_t members, const char *kernel) {
  if (dim < 0 || dim >= static_cast<int64_t>(whole.size()))
    fail(kernel, ": dim ", dim, " is outside ", shapeStr(whole));
  int64_t s = whole[dim];
  if (s % (2 * members))
    fail(kernel, ": sequence length ", s, " is not divisible by 2·cp = ",
         2 * members);
  return s;
}

int64_t mapp::rt::expertRowElems(const Tensor &src, const Tensor &dst,
                                 const char *kernel) {
  if (src.rank() < 1 || dst.rank() != src.rank())
    fail(kernel, ": x ", shapeStr(src.type.shape), " and y ",
         shapeStr(dst.type.shape), " must be [rows, ...] of the same rank");
  for (int d = 1; d < src.rank(); ++d)
    if (src.type.shape[d] != dst.type.shape[d])
      fail(kernel, ": x ", shapeStr(src.type.shape), " and y ",
           shapeStr(dst.type.shape), " differ past the row dimension");
  return src.type.shape[0] ? src.numel() / src.type.shape[0] : 0;
}

void mapp::rt::checkExpertCapacity(const char *kernel, const CommGroup &g,
                                   int rank, int64_t recvTotal,
                                   int64_t capacity) {
  if (recvTotal > capacity)
    fail(kernel, " over ", g.str(), " (rank ", rank, "): ", recvTotal,
         " rows routed to this rank's experts, y holds ", capacity,
         " (capacity too small)");
}

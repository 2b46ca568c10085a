//===- Comm.cpp - communication kernels over the Communicator -------------===//
//
// Kernels stay backend-side so a device backend can stage buffers; the
// Communicator moves bytes. A group of one rank makes every collective a
// copy, which is what the local communicator provides.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "CpuKernels.h"
#include "mapp/rt/Error.h"

#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

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

void copyThrough(const KernelArgs &a) {
  if (a.out[0].data != a.in[0].data)
    std::memmove(a.out[0].data, a.in[0].data, a.in[0].numel() * sizeof(float));
}

/// Collectives whose data layout across several ranks is not written yet
/// run only over groups of one rank, where they are copies.
void singleRankOnly(const KernelArgs &a, const char *kernel) {
  Communicator &c = commOf(a, kernel);
  int n = c.groupSize(groupOf(a, kernel));
  if (n != 1)
    fail(kernel, ": groups of ", n, " ranks need a multi-rank communicator; '",
         c.name(), "' supports only single-rank groups for this kernel");
  if (a.in[0].numel() != a.out[0].numel())
    fail(kernel, ": a single-rank group keeps the element count");
  copyThrough(a);
}

} // namespace

void cpu::all_reduce(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_reduce");
  std::string red = a.attrs.getStr("reduction", "sum");
  ReduceOp op;
  if (!parseReduceOp(red, op))
    fail("all_reduce: unknown reduction '", red, "'");
  if (a.in[0].numel() != a.out[0].numel())
    fail("all_reduce: x and y differ in element count");
  copyThrough(a);
  c.allReduce(a.out[0].f32(), a.out[0].numel(), op, groupOf(a, "all_reduce"));
}

void cpu::all_gather(const KernelArgs &a) {
  Communicator &c = commOf(a, "all_gather");
  Group g = groupOf(a, "all_gather");
  int n = c.groupSize(g);
  if (n == 1)
    return singleRankOnly(a, "all_gather");
  // Several ranks: only gathering along dim 0 is a plain concatenation.
  if (a.attrs.getInt("dim", 0) != 0 || a.out[0].numel() != n * a.in[0].numel())
    fail("all_gather: only dim 0 with y = ", n, " x x is supported");
  c.allGather(a.in[0].f32(), a.out[0].f32(), a.in[0].numel(), g);
}

void cpu::reduce_scatter(const KernelArgs &a) {
  singleRankOnly(a, "reduce_scatter");
}

void cpu::all_to_all(const KernelArgs &a) { singleRankOnly(a, "all_to_all"); }

void cpu::send(const KernelArgs &a) {
  commOf(a, "send").send(a.in[0].data,
                         a.in[0].numel() * dtypeSize(a.in[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         static_cast<int>(a.attrs.getInt("tag", 0)));
}

void cpu::recv(const KernelArgs &a) {
  commOf(a, "recv").recv(a.out[0].data,
                         a.out[0].numel() * dtypeSize(a.out[0].type.dtype),
                         static_cast<int>(a.attrs.getInt("peer", 0)),
                         static_cast<int>(a.attrs.getInt("tag", 0)));
}

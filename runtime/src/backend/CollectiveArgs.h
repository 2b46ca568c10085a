//===- CollectiveArgs.h - A collective kernel's arguments, checked once -*- C++ -*-===//
//
// What the CPU and CUDA communication kernels (cpu/CommKernels.cpp,
// cpu/ContextParallel.cpp, cpu/ExpertComm.cpp and their .cu twins) check
// before they move data: a communicator is attached, the group resolves and
// holds this rank, a group of one keeps the element count, y's shape is the
// one the collective makes of x. One function per check, with one message,
// so the backends cannot drift apart (test/runtime-unit/CollectiveArgsTest).
// Private to runtime/src/backend.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKEND_COLLECTIVEARGS_H
#define MAPP_RT_BACKEND_COLLECTIVEARGS_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Kernels.h"

#include <cstdint>
#include <utility>

namespace mapp::rt {

/// The kernel's communicator; Error "<kernel>: no communicator attached".
Communicator &communicatorOf(const KernelArgs &a, const char *kernel);
/// The kernel's group: attribute "group" (default given) or "ranks".
CommGroup kernelGroupOf(const KernelArgs &a, Communicator &c,
                        const char *defaultGroup);
/// Attribute "reduction" (default given); Error naming the kernel when
/// unknown.
ReduceOp reductionOf(const KernelArgs &a, const char *kernel,
                     const char *dflt);

/// The dimension attr `key` of a communication kernel on t, negative counted
/// from the back; Error naming the kernel when out of range.
int64_t dimAttr(const KernelArgs &a, const char *key, const Tensor &t,
                const char *kernel);
/// y must be x with dimension `dim` scaled by num/den; Error otherwise.
void wantScaled(const Tensor &x, const Tensor &y, int64_t dim, int64_t num,
                int64_t den, const char *kernel, const CommGroup &g);

enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll };

/// How a collective's checked x (a.in[0]) becomes y (a.out[0]).
struct CollectiveLayout {
  bool copyOnly = false; // all_reduce's own buffer, or a group of one
  int64_t dim = 0;       // all_gather / reduce_scatter: the dim it scales
  int64_t splitDim = 0, concatDim = 0; // all_to_all
  Shape piece; // all_to_all: what one member gets (x split along splitDim)
};
/// Checks x and y of collective `c` over `g`; Error naming the kernel and
/// the group otherwise. all_reduce and a group of one keep the element
/// count (copyOnly; all_reduce still reduces).
CollectiveLayout checkCollective(Collective c, const KernelArgs &a,
                                 const CommGroup &g);

/// A context-parallel kernel's cp group over `c` (attribute "group",
/// default "cp"): its size must be the compiled `members`, and it must hold
/// this rank.
CommGroup cpGroupOf(const KernelArgs &a, Communicator &c, const char *kernel);
/// (this member's index, members) of a cp layout kernel; (0, 1) without a
/// communicator (a one-rank run of a cp=1 plan).
std::pair<int64_t, int64_t> cpMemberOf(const KernelArgs &a,
                                       const char *kernel);
/// The sequence length along `dim` of a cp layout kernel's whole tensor;
/// Error unless the dim exists and the length splits into 2·members chunks.
int64_t cpSequenceOf(const Shape &whole, int64_t dim, int64_t members,
                     const char *kernel);

/// Elements per row of ep_dispatch's / ep_combine's [rows, ...] src and dst;
/// Error unless they agree past the row dimension.
int64_t expertRowElems(const Tensor &src, const Tensor &dst,
                       const char *kernel);
/// Error when the rows routed to this rank's experts (`recvTotal`) do not
/// fit y's `capacity` rows.
void checkExpertCapacity(const char *kernel, const CommGroup &g, int rank,
                         int64_t recvTotal, int64_t capacity);

} // namespace mapp::rt

#endif // MAPP_RT_BACKEND_COLLECTIVEARGS_H

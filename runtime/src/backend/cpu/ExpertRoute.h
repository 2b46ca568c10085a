//===- ExpertRoute.h - where expert-parallel rows go (internal) -*- C++ -*-===//
//
// ep_dispatch / ep_combine (docs/expert-parallel.md): the rows a rank routed
// to each global expert (sorted by expert, as the permute leaves them) go to
// the member that owns the expert; the owner keeps them grouped by its local
// expert, source member minor. ExpertRoute is that layout, computed once from
// this rank's counts and the per-expert counts every member sends it (one
// small all_to_all), and shared by the CPU kernels and the CUDA ones.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CPU_EXPERT_ROUTE_H
#define MAPP_RT_CPU_EXPERT_ROUTE_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Kernels.h"

#include <cstdint>
#include <vector>

namespace mapp::rt::cpu {

struct ExpertRoute {
  int members = 1, self = 0;
  int64_t experts = 0, localExperts = 0;
  /// Rows this rank sends to / receives from each member.
  std::vector<int64_t> sendRows, recvRows;
  /// got[i * localExperts + e]: rows member i routed to this rank's local
  /// expert e.
  std::vector<int64_t> got;
  int64_t sentTotal = 0, recvTotal = 0;
  /// Per local expert: rows over all members.
  std::vector<int64_t> localCounts;

  /// Offset (rows) of member i's block for local expert e in the
  /// member-major receive buffer, and in the expert-major layout.
  int64_t memberMajor(int i, int64_t e) const;
  int64_t expertMajor(int i, int64_t e) const;
};

/// Reads the counts tensor (f32 holding integers, i32 or i64) of kernel
/// `kernel`; Error on a negative or fractional count.
std::vector<int64_t> readCounts(const Tensor &t, const char *kernel);

/// Exchanges per-expert counts over `g` and builds the route. Errors (all
/// located by the kernel name and group): experts not divisible by the
/// group size; counts that add up to more rows than `rows`.
ExpertRoute routeExperts(Communicator &c, const CommGroup &g,
                         const std::vector<int64_t> &counts, int64_t rows,
                         const char *kernel);

/// The group of an expert-parallel kernel (attr `group`, default "ep").
CommGroup expertGroup(const KernelArgs &a, Communicator &c);

/// Writes the route's rows per local expert into ep_dispatch's
/// `local_counts` (i32, i64 or f32, host memory); Error unless it holds one
/// per local expert.
void writeLocalCounts(Tensor &t, const ExpertRoute &r, const char *kernel);

/// Bytes per member of the route for the trace (rows * rowBytes), send and
/// receive as seen from this rank; `forward` false swaps them (combine).
void notePeerBytes(const KernelArgs &a, const ExpertRoute &r,
                   uint64_t rowBytes, bool forward);

} // namespace mapp::rt::cpu

#endif

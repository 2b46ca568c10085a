//===- AllToAllLoad.h - bytes per peer of variable all_to_alls --*- C++ -*-===//
//
// Expert parallelism's dispatch and combine move as many bytes to each peer
// as tokens were routed to its experts; an unbalanced expert (Megatron's
// named cause of MoE instability) shows as one peer receiving far more
// than the others. Per rank and all_to_all name: the bytes summed over the
// traced steps, and max/mean over the peers.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_ALLTOALLLOAD_H
#define MAPP_SCAN_ALLTOALLLOAD_H

#include "mapp/scan/Trace.h"

#include <string>
#include <vector>

namespace mapp::scan {

struct AllToAllLoad {
  int rank = 0;
  std::string name;            // the event name (ep_dispatch, ...)
  std::vector<int> members;    // the group, member order (empty: unknown)
  int events = 0;
  std::vector<uint64_t> sendBytes, recvBytes; // summed over the events
  double recvImbalance = 1;    // max / mean of recvBytes (1 = balanced)
  double sendImbalance = 1;
};

/// One entry per (rank, name) with per-peer bytes, rank then name order.
std::vector<AllToAllLoad> allToAllLoads(const Trace &t);

} // namespace mapp::scan

#endif

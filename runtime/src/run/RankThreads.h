//===- RankThreads.h - one thread per rank of a thread world ----*- C++ -*-===//
//
// Shared by mapp-run's rank threads (Run.cpp) and --calibrate's
// communicator measurement (Calibrate.cpp): both start a thread per rank
// over a LocalWorld and must not hang when one rank fails.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_RUN_RANK_THREADS_H
#define MAPP_RT_RUN_RANK_THREADS_H

#include "mapp/rt/Comm.h"

#include <functional>
#include <string>
#include <vector>

namespace mapp::rt {

/// How a world of rank threads ended.
struct RankThreadsEnd {
  int firstFailed = -1;            // the first rank that failed; -1: none
  std::vector<std::string> errors; // per rank: its failure, "" if none
  std::vector<int> crashed;        // ranks a rank-crash fault killed
};

/// Runs body(r) on one thread per rank of `world` and joins them all. A
/// rank whose body throws is marked failed in the world (LocalWorld::abort)
/// so that the ranks waiting on it fail too rather than hang; a RankCrashed
/// (an injected crash: the loss of the rank) is also listed in `crashed`.
RankThreadsEnd runOnRankThreads(LocalWorld &world,
                                const std::function<void(int rank)> &body);

} // namespace mapp::rt

#endif

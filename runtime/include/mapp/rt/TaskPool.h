//===- TaskPool.h - the adaptive scheduler's task rules ---------*- C++ -*-===//
//
// Which of a rank's pipeline tasks may run next under the depth-first (dfc)
// or the breadth-first (bfc) policy, and the activation stash they reserve:
// the adaptive scheduler's rules without its communication. The runtime's
// scheduler (runtime/src/sched/AdaptiveScheduler.cpp) adds posted receives,
// link measurement and tensor-parallel agreement; mapp-sim decides with the
// same rules on its modeled arrivals (scan/lib/SimPlan.cpp adaptiveOrders),
// so a memory cap bounds the simulated schedule as it bounds the real one.
//
// A task is a candidate when
//  - the tasks of its microbatch before it in the dfc table ran (the per-
//    microbatch order is a topological order: F chunk 0..v-1, B v-1..0),
//  - the tasks of its block for earlier microbatches ran (fixed gradient
//    accumulation order; and grad_sync fires on the last microbatch),
//  - its microbatch's arena slot is free or its own, and
//  - if it is the microbatch's first task here, admitting the microbatch
//    keeps the reserved stash (chunks not yet backwarded x stash_bytes,
//    over admitted microbatches) within the cap, and under dfc within the
//    number of microbatches the dfc table keeps in flight.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_TASK_POOL_H
#define MAPP_RT_TASK_POOL_H

#include "mapp/rt/Plan.h"

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace mapp::rt::sched {

enum Policy : int { DFC = 0, BFC = 1 };
const char *policyName(int policy);

struct PoolTask {
  Task task;
  int chunk = 0;
  bool forward = false, backward = false;
  int rank[2] = {0, 0}; ///< index in the dfc / bfc table
  int mbPos = 0;        ///< position among its microbatch's tasks
  bool done = false, running = false;
};

class TaskPool {
public:
  /// The tasks of `p`'s 'dfc' and 'bfc' tables (optimizer blocks left out:
  /// they run at the step's end). Fails (rt::Error) when a table is missing
  /// or the two disagree, and when `capBytes` (0: none) is below one
  /// microbatch's activations.
  TaskPool(const Plan &plan, const Program &p, uint64_t capBytes);

  /// Every task not run, nothing reserved.
  void beginStep();
  /// Not run and its dependencies met (its microbatch's earlier tasks, its
  /// block's earlier microbatches, its arena slot).
  bool waiting(int i) const;
  /// Whether task i may start under `policy` (the admission of a new
  /// microbatch: the cap, and under dfc the dfc table's open microbatches).
  bool admissible(int i, int policy) const;
  /// Candidates under each policy: waiting and admissible.
  void candidates(std::vector<int> out[2]) const;
  /// Whether one more microbatch's stash fits the cap.
  bool nextFits() const;
  /// The candidate of `pool` first in `policy`'s table among those `ok`
  /// allows (ok[i] != 0; null: all); -1 if none.
  int pick(const std::vector<int> &pool, int policy,
           const std::vector<char> *ok) const;
  void start(int i);
  /// Marks the running task `t` done; false if it was not handed out.
  bool finish(const Task &t);

  size_t size() const { return tasks_.size(); }
  const PoolTask &operator[](size_t i) const { return tasks_[i]; }
  int remaining() const { return remaining_; }
  int chunksPerMicrobatch() const { return v_; }
  uint64_t stashBytes() const { return stash_; }
  uint64_t capBytes() const { return cap_; }
  /// The largest in-flight stash (chunks forwarded, not yet backwarded).
  uint64_t peakStashBytes() const { return peakStash_; }

private:

  std::vector<PoolTask> tasks_;
  int numMb_ = 0, v_ = 0, dfcMaxOpen_ = 0;
  std::set<int> stashChunks_;
  std::vector<int> mbTasks_;
  std::map<std::pair<int, int>, int> chunkBwd_;
  std::map<int, std::set<int>> blockMbs_;
  uint64_t stash_ = 0, cap_ = 0, peakStash_ = 0;
  int slots_ = 1;
  // Step state.
  int remaining_ = 0, open_ = 0;
  int64_t reserved_ = 0; ///< chunks reserved by admitted microbatches
  std::vector<int> mbLeft_, slotOwner_;
  std::vector<bool> mbStarted_;
  std::map<int, int> nextMbOfBlock_;
  std::map<std::pair<int, int>, int> bwdLeft_;
  std::set<std::pair<int, int>> inflight_;
};

} // namespace mapp::rt::sched

#endif // MAPP_RT_TASK_POOL_H

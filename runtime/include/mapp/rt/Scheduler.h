//===- Scheduler.h - which task a rank runs next (MegaDPP) ------*- C++ -*-===//
//
// The executor runs the task the scheduler hands it (docs/megadpp.md).
//
//  - static: the plan's table in order (Program.tasks; every non-optimizer
//    block per microbatch when the table is empty). Receives are the recv
//    kernels' blocking calls, as before.
//  - adaptive (Plan.schedule == "adaptive"; the plan carries the DFC and BFC
//    tables): every receive of the step is posted at its start into a
//    preallocated host buffer (irecv): the payload, or the device
//    communicator's letter naming the device memory that holds it. At each decision the scheduler picks,
//    among the tasks whose receives have arrived and whose local
//    predecessors ran, the one ranked first by the current policy's table:
//    breadth-first (bfc) while a link is measured slow and the next
//    microbatch's stash fits under the memory cap, depth-first (dfc)
//    otherwise. Admission of a new microbatch reserves the stash of all its
//    chunks (chunks x stash_bytes), so the in-flight activations never pass
//    the cap and the oldest unfinished microbatch can always proceed (no
//    deadlock; test/runtime-unit/SchedulerTest.cpp runs random delays).
//    Ranks of a tensor-parallel group agree on every decision with one small
//    all-reduce (ready bits, slow flag); a rank with nothing ready blocks in
//    Communicator::waitAny.
//
// Numerics: tasks of one block run in microbatch order under every policy,
// so each block accumulates its gradients in the same order as the static
// table; the loss is then independent of the interleaving chosen.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_SCHEDULER_H
#define MAPP_RT_SCHEDULER_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Plan.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

struct SchedOptions {
  /// "static" | "adaptive" | "" (adaptive iff the plan's schedule is).
  std::string mode;
  /// Overrides AdaptivePolicy.mem_cap_bytes when > 0; 0 keeps the plan's.
  uint64_t memCapBytes = 0;
  /// Free device memory of the backend (the cap when neither gives one;
  /// 0: no cap, host backends).
  uint64_t deviceFreeBytes = 0;
  /// Bytes of a posted receive into a value (Backend::postedRecvBytes: a
  /// device backend's letter); unset: the value's plan bytes.
  std::function<size_t(const Value &)> postedBytes;
  /// Microbatches this rank runs per step (an uneven data-parallel split,
  /// plans whose program has no task table); 0: the plan's.
  int microbatches = 0;
};

/// The tag of the adaptive scheduler's per-step slow-link verdicts between
/// the stages of a pipeline (beside the live monitor's 32001 and 32002).
constexpr int64_t kPipelineVerdictTag = 32003;

/// A policy switch: an instant event in the MegaScan trace.
struct SchedSwitch {
  int64_t step = 0;
  uint64_t ns = 0; // p2pNowNs clock
  std::string from, to, reason;
};

struct SchedStats {
  std::string mode;           // "static" | "adaptive"
  std::string policy;         // current ("dfc" | "bfc"; static: the plan's)
  uint64_t capBytes = 0;      // 0: no cap
  uint64_t stashBytes = 0;    // per (chunk, microbatch)
  uint64_t peakStashBytes = 0; // peak in-flight stash over all steps
  int64_t switches = 0;
  int64_t decisions = 0;
  /// Per incoming peer: smoothed transit (ns) and bandwidth (bytes/s).
  std::vector<std::pair<int, double>> transitNs, bytesPerS;
};

class TaskScheduler {
public:
  virtual ~TaskScheduler() = default;
  /// Starts a step (adaptive: posts the step's receives).
  virtual void beginStep(int64_t step) = 0;
  /// The next task; false when the step's tasks are all handed out.
  virtual bool next(Task &t) = 0;
  /// The executor finished `t`.
  virtual void finished(const Task &t) = 0;
  /// Adaptive: the received payload for the `k`-th recv instr of `t`'s block
  /// (null: the recv kernel receives itself). `stamps`, when given, gets
  /// the message's P2PRequest times (p2pNowNs clock).
  virtual const void *received(const Task &, int /*k*/,
                               RecvStamps * /*stamps*/ = nullptr) {
    return nullptr;
  }
  /// Policy switches since the last call.
  virtual std::vector<SchedSwitch> takeSwitches() { return {}; }
  virtual SchedStats stats() const = 0;
  /// Whether optimizer tasks of the table are handed out (static) or left
  /// to the executor's end of step (adaptive).
  virtual bool handsOutOptimizer() const = 0;
  /// Whether the scheduler acts on link verdicts from outside (the live
  /// monitor's); the adaptive one does, a static table cannot.
  virtual bool takesLinkVerdicts() const { return false; }
  /// The live monitor's verdict on the link from `src` to this rank.
  virtual void linkVerdict(int /*src*/, bool /*slow*/) {}
};

/// The table a static run walks: p.tasks, or every non-optimizer block per
/// microbatch when it is empty.
std::vector<Task> staticTasks(const Plan &plan, const Program &p,
                              int microbatches = 0);

/// The scheduler for `p` on `comm`'s rank; Error naming the problem for an
/// adaptive request the plan cannot serve (no dfc/bfc tables, a cap below
/// one microbatch's activations, ...).
std::unique_ptr<TaskScheduler> createScheduler(const Plan &plan,
                                               const Program &p,
                                               Communicator &comm,
                                               const SchedOptions &o);

} // namespace mapp::rt

#endif

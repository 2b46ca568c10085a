//===- Faults.h - fault injection for evaluation ----------------*- C++ -*-===//
//
// mapp-run --inject SPEC (repeatable), SPEC one of
//   slow-compute:rank=R,factor=F      rank R sleeps (F-1) x the measured time
//                                     of each compute instr after running it
//   link-delay:src=A,dst=B,us=U       a message from A to B becomes
//                                     deliverable U us after it was sent
//   link-bandwidth:src=A,dst=B,gbps=G the link A->B moves G Gb/s: a message
//                                     occupies it bytes*8/(G*1e9) s after
//                                     the previous one left it
//   monitor-silence:rank=R            testing mapp-run --monitor: rank R
//                                     stops sending its step summaries
//                                     (the job itself goes on)
//   stop:rank=R,from-step=K           rank R's process stops itself
//                                     (SIGSTOP) at the start of step K,
//                                     as a hung process (testing
//                                     --comm-timeout; --comm=mpi only)
//   rank-crash:rank=R,at-step=K       rank R dies abruptly at the start of
//                                     step K (0-based): a process SIGKILLs
//                                     itself; a rank thread ends as if
//                                     killed (RankCrashed, the world is
//                                     told it is gone). ,back-at-step=L:
//                                     mapp-run --elastic may use the rank
//                                     again from step L (docs/elastic.md)
// each (but stop) optionally followed by ,from-step=K,to-step=L: active in
// steps K <= step < L only (default: every step), so a run sees a link go slow
// and recover. A link fault acts on the transfer as a slow wire would: the
// sender goes on at once, the receiver's recv (or posted irecv) completes
// only once the message is deliverable, so a schedule can hide the delay.
// It is applied on the receiving side (the message carries its send time);
// slow compute is taken inside the instr, so traces show it in the op's time.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FAULTS_H
#define MAPP_RT_FAULTS_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/FaultSpec.h"

#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

/// A parsed --inject spec (the grammar: FaultSpec.h).
using Injection = FaultSpec;

/// Parses one --inject value; Error naming what is wrong.
Injection parseInjection(const std::string &spec);
/// Product of the slow-compute factors aimed at `rank` that are active in
/// `step` (1 = none).
double slowComputeFactor(const std::vector<Injection> &inj, int rank,
                         int64_t step);
/// Stops this process (SIGSTOP) when a stop fault names `rank` at `step`.
void stopIfInjected(const std::vector<Injection> &inj, int rank, int64_t step);
/// A rank thread that a rank-crash fault killed: not an error of the rank,
/// the loss of it (mapp-run --elastic restarts without it).
struct RankCrashed : Error {
  RankCrashed(int rank, int64_t step)
      : Error("rank " + std::to_string(rank) +
              " died (injected rank-crash at step " + std::to_string(step) +
              ")"),
        rank(rank), step(step) {}
  int rank;
  int64_t step;
};
/// rank-crash at `step` of `rank`: SIGKILLs this process when `process`,
/// else throws RankCrashed.
void crashIfInjected(const std::vector<Injection> &inj, int rank, int64_t step,
                     bool process);

/// Wraps `c` so messages to it over a faulty link (dst = c's rank) become
/// deliverable only after the link's delay; returns `c` itself when no
/// fault names c's rank as dst.
std::unique_ptr<Communicator>
withLinkFaults(std::unique_ptr<Communicator> c,
               const std::vector<Injection> &inj);

} // namespace mapp::rt

#endif

//===- Faults.h - fault injection for evaluation ----------------*- C++ -*-===//
//
// mapp-run --inject SPEC (repeatable), SPEC one of
//   slow-compute:rank=R,factor=F      rank R sleeps (F-1) x the measured time
//                                     of each compute instr after running it
//   link-delay:src=A,dst=B,us=U       every send from A to B waits U us first
//   link-bandwidth:src=A,dst=B,gbps=G every send from A to B waits
//                                     bytes*8 / (G*1e9) s first
// Delays are taken inside the instr, so traces show them in the op's time.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FAULTS_H
#define MAPP_RT_FAULTS_H

#include "mapp/rt/Comm.h"

#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

struct Injection {
  enum Kind { SlowCompute, LinkDelay, LinkBandwidth } kind = SlowCompute;
  int rank = -1, src = -1, dst = -1;
  double factor = 1, us = 0, gbps = 0;
};

/// Parses one --inject value; Error naming what is wrong.
Injection parseInjection(const std::string &spec);
/// Product of the slow-compute factors aimed at `rank` (1 = none).
double slowComputeFactor(const std::vector<Injection> &inj, int rank);
/// Wraps `c` so its sends to each peer are delayed per the link faults whose
/// src is c's rank; returns `c` itself when none applies.
std::unique_ptr<Communicator>
withLinkFaults(std::unique_ptr<Communicator> c,
               const std::vector<Injection> &inj);

} // namespace mapp::rt

#endif

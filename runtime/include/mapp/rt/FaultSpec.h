//===- FaultSpec.h - the fault-spec grammar ---------------------*- C++ -*-===//
//
// One fault spec, `KIND:key=value,...`, as mapp-run --inject (Faults.h says
// what each fault does to a run) and mapp-sim (--inject and its config's
// "faults") read it. The kinds, keys, value checks and error messages are
// here only; each caller adds where the spec came from and the checks only
// it can make (mapp-sim: ranks inside its world, the kinds it models).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FAULTSPEC_H
#define MAPP_RT_FAULTSPEC_H

#include <cstdint>
#include <string>

namespace mapp::rt {

struct FaultSpec {
  enum Kind {
    SlowCompute,    // rank=R,factor=F (F >= 1)
    LinkDelay,      // src=A,dst=B,us=U (U >= 0)
    LinkBandwidth,  // src=A,dst=B,gbps=G (G > 0)
    MonitorSilence, // rank=R
    Stop,           // rank=R (from-step=K; no to-step)
    RankCrash       // rank=R,at-step=K[,back-at-step=L] (no from/to-step)
  } kind = SlowCompute;
  int rank = -1, src = -1, dst = -1;
  double factor = 1, us = 0, gbps = 0;
  // active in [fromStep, toStep); toStep -1: no end
  int64_t fromStep = 0, toStep = -1;
  bool activeAt(int64_t step) const {
    return step >= fromStep && (toStep < 0 || step < toStep);
  }
};

/// The name of `k` as a spec writes it ("slow-compute", ...).
const char *faultKindName(FaultSpec::Kind k);

/// Parses `spec`. False with *error the problem (without the spec itself:
/// the caller names it and where it came from) on a malformed one.
bool parseFaultSpec(const std::string &spec, FaultSpec &out,
                    std::string *error);

} // namespace mapp::rt

#endif

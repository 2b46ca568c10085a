//===- TraceVocab.h - plan kernels and blocks as trace vocabulary -*- C++ -*-===//
//
// How the executor names what it records (internal to exec/).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_EXEC_TRACEVOCAB_H
#define MAPP_RT_EXEC_TRACEVOCAB_H

#include "mapp/rt/Plan.h"
#include "mapp/trace/TraceFormat.h"

#include <string>

namespace mapp::rt::exec {

// Communication kernels are named as the trace ops they record (the trace
// vocabulary, mapp/trace/TraceFormat.h); the plan's trace instrs name a
// category the same way.
inline mapp::TraceOp traceOpOf(const std::string &kernel) {
  mapp::TraceOp op;
  // Expert-parallel dispatch/combine are variable all_to_alls.
  if (kernel == "ep_dispatch" || kernel == "ep_combine")
    return mapp::TraceOp::AllToAll;
  if (!mapp::trace::parseOp(kernel, op) || op > mapp::TraceOp::AllToAll)
    return mapp::TraceOp::None;
  return op;
}

// The trace's "phase": which pass of the step a block's events belong to.
inline mapp::TracePhase phaseOf(BlockKind k) {
  switch (k) {
  case BlockKind::Forward:
    return mapp::TracePhase::Forward;
  case BlockKind::Backward:
    return mapp::TracePhase::Backward;
  case BlockKind::BackwardInput:
    return mapp::TracePhase::BackwardInput;
  case BlockKind::BackwardWeight:
    return mapp::TracePhase::BackwardWeight;
  default:
    return mapp::TracePhase::None;
  }
}

inline mapp::TraceCategory categoryOf(const std::string &c) {
  mapp::TraceCategory cat;
  return mapp::trace::parseCategory(c, cat) ? cat
                                            : mapp::TraceCategory::Compute;
}

} // namespace mapp::rt::exec

#endif

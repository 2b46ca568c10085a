//===- ExecutorInstr.h - The Executor's prepared instrs (internal) -*- C++ -*-===//
//
// What runBlock runs (ExecutorBlock.cpp) and what a step clears at its start
// (ExecutorStep.cpp): instrs resolved against the backend, and the trace
// regions open between a trace_begin and its trace_end.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_EXEC_EXECUTORINSTR_H
#define MAPP_RT_EXEC_EXECUTORINSTR_H

#include "mapp/rt/Executor.h"
#include "mapp/trace/TraceWriter.h"

#include <string>
#include <vector>

namespace mapp::rt {

/// An instr resolved against the backend with operand views per slot, so the
/// hot loop only calls a function pointer.
struct Executor::Prepared {
  const Instr *instr;
  KernelFn fn;
  std::vector<std::vector<Tensor>> ins, outs; // [slot][operand]
  enum Kind { Compute, Comm, TraceBegin, TraceEnd } kind = Compute;
  mapp::TraceOp op = mapp::TraceOp::None;
  int workLayer = -1; // workLayers(): whose work this is (re-partitioning)
  CommGroup group;    // collectives
  uint64_t bytes = 0;
  // trace_begin: its region's record fields, read from the attrs once (a
  // region per op is traced every step the monitor runs); trace_end: id.
  struct Region {
    int64_t id = -1;
    std::string name;
    mapp::TraceCategory cat = mapp::TraceCategory::Compute;
    int32_t layer = -1;
    uint64_t bytes = 0;
    bool timesCpu = true; // no comm inside: its record carries CPU time
  } region;
};

/// A trace_begin seen in this step whose trace_end has not come yet.
struct Executor::OpenRegion {
  int64_t id;
  const Prepared *begin;
  uint64_t t0;
  uint64_t cpu0; // thread CPU clock at t0 (cpuTimed_ only)
  int mb, chunk;
  mapp::TraceOp op = mapp::TraceOp::None;
  int group = -1;
  int64_t seq = -1;
  int peer = -1;
  int64_t tag = -1;
  uint64_t bytes = 0;
  RecvStamps stamps; // recv: the message's P2P times
  int32_t peerBytes = -1; // variable all_to_all: MappTraceWriter's entry
};

} // namespace mapp::rt

#endif // MAPP_RT_EXEC_EXECUTORINSTR_H

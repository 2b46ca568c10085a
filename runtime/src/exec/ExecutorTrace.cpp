//===- ExecutorTrace.cpp - the executor's MegaScan trace plumbing ---------===//
//
// Sampling, comm-group registration and the executor's own regions; the
// trace marks around instrs are taken in Executor::runBlock
// (ExecutorBlock.cpp: openRegion, closeRegion, recordOp). Records go
// through a TraceSink, which holds those timed by deferred backend marks
// (CUDA events) until their step is over (runtime/README.md, "Tracing").
//
//===----------------------------------------------------------------------===//
#include "TraceSink.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"

#include <algorithm>

using namespace mapp::rt;

void Executor::setTraceWriter(mapp::MappTraceWriter *w) {
  sink_.reset(); // appends what the old writer is still owed
  trace_ = w;
  traceGroups_.clear();
  if (w)
    sink_ = std::make_unique<TraceSink>(backend_, *w, 2 * traceEventsPerStep());
}

void Executor::setTraceSampling(int every, int window) {
  if (every < 0 || window < 0)
    fail("trace sampling: every (", every, ") and window (", window,
         ") must be >= 0");
  traceEvery_ = every;
  traceWindow_ = window;
}

void Executor::flushTrace() {
  if (sink_)
    sink_->flush();
}

size_t Executor::traceEventsPerStep() const {
  // Every traced instr can be one event (plans without trace instrs record
  // each instr), plus the data, optimizer and metrics regions.
  const Program &p = *prog_;
  size_t perStep = 0, optimizer = 0;
  std::vector<size_t> perBlock(p.blocks.size());
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    perBlock[b] = p.blocks[b].instrs.size();
    if (p.blocks[b].kind == BlockKind::Optimizer)
      optimizer += perBlock[b] + 1;
  }
  if (p.tasks.empty()) {
    for (size_t b = 0; b < p.blocks.size(); ++b)
      if (p.blocks[b].kind != BlockKind::Optimizer)
        perStep += perBlock[b] * microbatches();
  } else {
    for (const Task &t : p.tasks)
      if (p.blocks[t.block].kind != BlockKind::Optimizer)
        perStep += perBlock[t.block];
  }
  return perStep + optimizer + microbatches() + 1;
}

bool Executor::tracing() const {
  if (!trace_ || tracePaused_ || !sink_->accepting())
    return false;
  if (!planHasTrace_ || traceEvery_ <= 0)
    return true;
  return step_ % traceEvery_ < traceWindow_;
}

int Executor::traceGroup(const CommGroup &g) {
  auto it = traceGroups_.find(g.members);
  if (it != traceGroups_.end())
    return it->second;
  int id = trace_->registerGroup(g.kind, g.members);
  traceGroups_[g.members] = id;
  return id;
}

uint64_t Executor::cpuSince(uint64_t cpu0) const {
  if (!cpuTimed_)
    return 0;
  // At least 1: a record without "cpu" means "not measured".
  return std::max<uint64_t>(mapp::MappTraceWriter::threadCpuNs() - cpu0, 1);
}

void Executor::traceRegion(const char *name, int cat, int mb, uint64_t b,
                           uint64_t e, bool marked, uint64_t cpuNs) {
  mapp::TraceRecord rec;
  rec.setName(name);
  rec.cat = static_cast<mapp::TraceCategory>(cat);
  rec.step = static_cast<int32_t>(step_);
  rec.microbatch = mb;
  rec.beginNs = b;
  rec.endNs = e;
  rec.cpuNs = cpuNs;
  if (marked)
    sink_->appendMarked(rec);
  else
    sink_->appendHost(rec);
}

// MegaDPP policy switches: zero-length events on a "sched" track whose name
// carries the new policy and the reason (the record has no free text).
void Executor::traceSwitches() {
  std::vector<SchedSwitch> sw = sched_->takeSwitches();
  if (sink_ && tracing())
    for (const SchedSwitch &s : sw) {
      mapp::TraceRecord rec;
      rec.setName(("dpp " + s.to + ": " + s.reason).c_str());
      rec.setStream("sched");
      rec.cat = mapp::TraceCategory::Compute;
      rec.step = static_cast<int32_t>(s.step);
      rec.beginNs = rec.endNs = s.ns;
      sink_->appendHost(rec);
    }
  for (SchedSwitch &s : sw)
    pendingSwitches_.push_back(std::move(s));
}

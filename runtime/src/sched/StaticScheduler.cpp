//===- StaticScheduler.cpp - the plan's table, in order -------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Scheduler.h"
#include "AdaptiveScheduler.h"

#include <algorithm>
#include <map>

using namespace mapp::rt;

std::vector<Task> mapp::rt::staticTasks(const Plan &plan, const Program &p,
                                        int microbatches) {
  if (p.tasks.empty()) {
    std::vector<Task> tasks;
    for (int mb = 0; mb < (microbatches ? microbatches : plan.numMicrobatches);
         ++mb)
      for (size_t b = 0; b < p.blocks.size(); ++b)
        if (p.blocks[b].kind != BlockKind::Optimizer)
          tasks.push_back({static_cast<int>(b), mb});
    return tasks;
  }
  if (!microbatches || microbatches == plan.numMicrobatches)
    return p.tasks;
  // Another count (an uneven data-parallel split). A table that runs each
  // microbatch's tasks together, in microbatch order (pp = 1), repeats;
  // the step's own tasks (a block run once: the gradient sync on the last
  // microbatch, the optimizer) follow, on the new last microbatch.
  const int M = plan.numMicrobatches;
  std::map<int, int> runs; // block -> tasks
  for (const Task &t : p.tasks)
    ++runs[t.block];
  std::vector<Task> pattern, tail;
  for (const Task &t : p.tasks)
    if (runs[t.block] == M && M > 1 && t.microbatch == 0)
      pattern.push_back(t);
    else if (runs[t.block] == 1)
      tail.push_back(t);
  const size_t body = pattern.size() * M;
  bool repeats = !pattern.empty() && body + tail.size() == p.tasks.size();
  for (size_t i = 0; repeats && i < body; ++i)
    repeats = p.tasks[i].block == pattern[i % pattern.size()].block &&
              p.tasks[i].microbatch == static_cast<int>(i / pattern.size());
  if (!repeats)
    fail("rank ", p.rank, "'s task table interleaves microbatches (a "
         "pipeline schedule): it cannot run ", microbatches,
         " microbatches instead of the plan's ", M);
  std::vector<Task> tasks;
  for (int mb = 0; mb < microbatches; ++mb)
    for (Task t : pattern) {
      t.microbatch = mb;
      tasks.push_back(t);
    }
  for (Task t : tail) {
    if (t.microbatch == M - 1)
      t.microbatch = microbatches - 1;
    tasks.push_back(t);
  }
  return tasks;
}

namespace {

/// Today's behaviour: walk the table; the recv kernels block.
class StaticScheduler final : public TaskScheduler {
public:
  StaticScheduler(const Plan &plan, const Program &p, int microbatches)
      : prog_(p), tasks_(staticTasks(plan, p, microbatches)) {
    stats_.mode = "static";
    stats_.policy = plan.schedule;
    stats_.stashBytes = p.stashBytes;
    // In-flight stash bookkeeping (for the report only): a (chunk, mb) is
    // in flight from its first forward task to its last backward task.
    for (const Task &t : tasks_)
      if (p.blocks[t.block].kind != BlockKind::Forward &&
          p.blocks[t.block].kind != BlockKind::Optimizer)
        ++bwdCount_[{p.blocks[t.block].chunk, t.microbatch}];
  }
  void beginStep(int64_t step) override {
    step_ = step;
    next_ = 0;
    left_ = bwdCount_;
    inflight_ = 0;
  }
  bool next(Task &t) override {
    if (next_ >= tasks_.size())
      return false;
    t = tasks_[next_++];
    return true;
  }
  void finished(const Task &t) override {
    const Block &b = prog_.blocks[t.block];
    auto key = std::make_pair(b.chunk, t.microbatch);
    auto it = left_.find(key);
    if (it == left_.end())
      return; // optimizer, or a chunk without a backward
    if (b.kind == BlockKind::Forward) {
      if (!started_.count(key) || started_[key] != step_) {
        started_[key] = step_;
        ++inflight_;
        stats_.peakStashBytes = std::max<uint64_t>(
            stats_.peakStashBytes, inflight_ * prog_.stashBytes);
      }
    } else if (--it->second == 0) {
      --inflight_;
    }
  }
  SchedStats stats() const override { return stats_; }
  bool handsOutOptimizer() const override { return true; }

private:
  const Program &prog_;
  std::vector<Task> tasks_;
  size_t next_ = 0;
  SchedStats stats_;
  std::map<std::pair<int, int>, int> bwdCount_, left_;
  std::map<std::pair<int, int>, int64_t> started_;
  int64_t step_ = -1;
  uint64_t inflight_ = 0;
};

} // namespace


std::unique_ptr<TaskScheduler>
mapp::rt::createScheduler(const Plan &plan, const Program &p,
                          Communicator &comm, const SchedOptions &o) {
  std::string mode = o.mode;
  if (mode.empty())
    mode = plan.schedule == "adaptive" ? "adaptive" : "static";
  if (mode == "static")
    return std::make_unique<StaticScheduler>(plan, p, o.microbatches);
  if (mode == "adaptive")
    return sched::createAdaptiveScheduler(plan, p, comm, o);
  fail("--schedule '", mode, "': unknown scheduler (static, adaptive)");
}

//===- StepGraph.h - when a training step is captured or replayed -*- C++ -*-===//
//
// The host side of MAPP_CUDA_GRAPH (docs/cuda-graphs.md), with no CUDA in it
// so it is unit-tested on any machine. A captured step bakes in what its
// launches read from the host: which schedule table runs, the state of every
// MegaScope perturbation switch, the loss scale. StepGraphKey is that set;
// StepGraphCache decides per step whether to run eagerly (the first step
// under a key: handles, workspaces, cuDNN plans and scratch buffers grow
// there, which a capture cannot do), to capture (the second step under the
// same key) or to replay a graph captured before. It keeps at most
// `capacity` graphs, dropping the least recently used one.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_STEPGRAPH_H
#define MAPP_RT_STEPGRAPH_H

#include <cstdint>
#include <list>
#include <string>
#include <vector>

namespace mapp::rt {

/// What a captured step depends on besides the plan and the data.
struct StepGraphKey {
  /// The schedule table in use (scheduler mode and table name).
  std::string schedule;
  /// Per perturb instruction of the program, in order: its switch's state
  /// (0 off, 1 on) and magnitude, as the step would launch them.
  std::vector<std::pair<int, double>> switches;
  /// The loss scale the backward seed is multiplied by (a kernel argument).
  double lossScale = 1;
  /// A traced step's bank of deferred trace marks (the CUDA backend's two
  /// event banks alternate by step; a graph records into the events it was
  /// captured with), -1 for a step without marks.
  int traceBank = -1;

  bool operator==(const StepGraphKey &o) const {
    return sameWork(o) && traceBank == o.traceBank;
  }
  /// Equal but maybe for the trace bank: the same kernels, so one's eager
  /// warm-up (or graph) means the other allocates nothing more either.
  bool sameWork(const StepGraphKey &o) const {
    return schedule == o.schedule && switches == o.switches &&
           lossScale == o.lossScale;
  }
  bool operator!=(const StepGraphKey &o) const { return !(*this == o); }
  /// One line for logs: "schedule=static switches=[1:0.5] loss_scale=1"
  /// (and " trace_bank=B" for a traced step).
  std::string str() const;
};

enum class StepGraphAction { Eager, Capture, Replay };

class StepGraphCache {
public:
  explicit StepGraphCache(size_t capacity = 4);

  /// The action for the next step under `key`. Replay and Capture name the
  /// graph in `id` (ids are never reused); Capture stores it, and may
  /// first evict one graph whose id is returned by takeEvicted().
  StepGraphAction next(const StepGraphKey &key, uint64_t &id);
  /// The capture of graph `id` failed or its replay must not be used again:
  /// forgets it (the next step under its key runs eagerly and captures
  /// again the step after).
  void forget(uint64_t id);
  /// Everything captured is stale (a program was bound again, buffers the
  /// graphs point at moved): every key warms up again.
  void clear();
  /// Ids of graphs dropped since the last call (LRU eviction, forget,
  /// clear): the backend releases them.
  std::vector<uint64_t> takeEvicted();

  size_t capacity() const { return capacity_; }
  size_t size() const { return graphs_.size(); }
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eagerSteps() const { return eager_; }

private:
  struct Entry {
    StepGraphKey key;
    uint64_t id;
  };
  size_t capacity_;
  std::list<Entry> graphs_; // most recently used first
  std::vector<uint64_t> evicted_;
  StepGraphKey warmKey_; // the key of the last eager step
  bool warm_ = false;
  uint64_t nextId_ = 1;
  int64_t captures_ = 0, replays_ = 0, eager_ = 0;
};

} // namespace mapp::rt

#endif

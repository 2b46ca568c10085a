//===- TraceEvents.h - CUDA events for MegaScan trace marks -----*- C++ -*-===//
//
// A trace mark on the CUDA backend is an event recorded on the compute
// stream, taken from a pool created before the traced steps (events with
// timing and without blocking sync: cudaEventDefault). Marks are resolved to
// the host's monotonic clock after the step's end synchronize, with no wait
// added to the step:
//
//   host(mark) = A + elapsed(anchor, mark)
//
// where `anchor` is an event recorded first thing in beginStep, on the
// stream left idle by the previous step's end synchronize, and A its host
// time: at least the host time just before the record call; about the time
// the call returned when the stream was idle (checked with cudaStreamQuery);
// and at most (host time the end synchronize returned) - elapsed(anchor,
// end), `end` being an event recorded in endStep. docs/trace-format.md
// ("GPU timestamps") gives the error bounds.
//
// Two banks of events alternate by step, so the marks of step k can be
// resolved on another thread while step k+1 records into the other bank;
// the executor's TraceSink waits for step k's resolution before step k+2.
//
// Inside a stream capture (MAPP_CUDA_GRAPH) a mark is an external event
// record node of the graph, which records the same event at each launch;
// launched, the graph's marks are taken as a range of the bank (take).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_TRACEEVENTS_H
#define MAPP_RT_CUDA_TRACEEVENTS_H

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mapp::rt::cuda {

class TraceEventPool {
public:
  TraceEventPool() = default;
  ~TraceEventPool();
  TraceEventPool(const TraceEventPool &) = delete;
  TraceEventPool &operator=(const TraceEventPool &) = delete;

  /// Creates events for `marksPerStep` marks in each bank; the first call
  /// arms the pool (anchors are recorded from then on). Between steps.
  void reserve(size_t marksPerStep);
  bool armed() const { return armed_; }
  /// First thing in a step: switches bank, records the anchor.
  void beginStep(cudaStream_t s);
  /// A mark: the next event of the bank, recorded on `s` (as a graph node
  /// when `s` is capturing). When the bank is exhausted mid-step one more
  /// event is created (counted in grownMidStep).
  uint64_t record(cudaStream_t s, bool capturing);
  /// The current step's bank and how many of its marks are taken.
  int bank() const { return current_; }
  size_t used() const { return banks_[current_].used; }
  /// A launched graph records marks [first, first + n) of `bank`, which
  /// must be the current step's, with exactly `first` marks taken so far:
  /// they count as taken.
  void take(int bank, size_t first, size_t n);
  /// Last thing in a step before its end synchronize.
  void endStep(cudaStream_t s);
  /// Called right after every synchronize of the stream returns: the first
  /// one after endStep fixes the bank's upper bound on the anchor time.
  void synchronized();
  /// Host monotonic ns of marks of one ended step (same bank), in place.
  void resolve(uint64_t *marks, size_t n) const;

  uint64_t grownMidStep() const { return grownMidStep_; }

private:
  struct Bank {
    std::vector<cudaEvent_t> events;
    size_t used = 0;
    cudaEvent_t anchor = nullptr, end = nullptr;
    uint64_t anchorBeforeNs = 0, anchorAfterNs = 0;
    bool idleAtAnchor = false;
    bool anchored = false, ended = false;
    uint64_t syncNs = 0; // 0 until the end synchronize returned
  };
  static void grow(Bank &b, size_t n);

  Bank banks_[2];
  int current_ = 1; // the first beginStep switches to bank 0
  bool armed_ = false;
  uint64_t grownMidStep_ = 0;
};

/// Host monotonic clock (MappTraceWriter::nowNs's), ns.
uint64_t hostNowNs();

} // namespace mapp::rt::cuda

#endif

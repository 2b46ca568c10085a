//===- TraceSink.h - a step's trace records on their way out ----*- C++ -*-===//
//
// The executor hands every trace record to a TraceSink. Records timed by the
// host clock go straight to the writer. Records whose begin/end are deferred
// backend marks (a device backend's events, Backend::traceMarksDeferred)
// are held until their step has ended; then a resolver thread asks the
// backend for their host times and appends them while the training thread
// runs the next step, so resolving costs the step nothing. The two record
// buffers (by step parity) are reused: once the first traced steps have
// sized them, no event allocates.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_EXEC_TRACESINK_H
#define MAPP_RT_EXEC_TRACESINK_H

#include "mapp/rt/Backend.h"
#include "mapp/trace/TraceWriter.h"

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mapp::rt {

class TraceSink {
public:
  /// `writer` is not owned; `marksPerStep` sizes the buffers and the
  /// backend's mark pool.
  TraceSink(Backend &backend, mapp::MappTraceWriter &writer,
            size_t marksPerStep);
  /// Resolves and appends what is still held, then stops the resolver.
  ~TraceSink();
  TraceSink(const TraceSink &) = delete;
  TraceSink &operator=(const TraceSink &) = delete;

  bool deferred() const { return deferred_; }
  /// False between steps with deferred marks (nothing can resolve them).
  bool accepting() const { return !deferred_ || inStep_; }
  mapp::MappTraceWriter &writer() { return writer_; }
  /// A mark now, in the backend's execution order.
  uint64_t mark() { return backend_.traceMark(); }
  /// A record whose beginNs/endNs are marks of the current step.
  void appendMarked(const mapp::TraceRecord &r);
  /// How many marked records the current step holds so far, and a copy of
  /// those from `first` on (a captured step graph's, appended again at
  /// each replay).
  size_t markedInStep() const {
    return deferred_ && inStep_ ? buffers_[current_].size() : 0;
  }
  std::vector<mapp::TraceRecord> markedSince(size_t first) const;
  /// A record whose beginNs/endNs are already host monotonic ns.
  void appendHost(const mapp::TraceRecord &r) { writer_.append(r); }

  /// Before the backend's beginStep: waits until the records of two steps
  /// back are resolved (their buffer and their backend marks are reused).
  void beginStep(int64_t step);
  /// After the step's end synchronize: the step's marked records go to the
  /// resolver.
  void endStep();
  /// Blocks until every record handed over so far is in the writer;
  /// reports a resolver failure as Error.
  void flush();

private:
  void run();
  void resolve(std::vector<mapp::TraceRecord> &records);
  void rethrowFailure();

  Backend &backend_;
  mapp::MappTraceWriter &writer_;
  const bool deferred_;
  std::vector<mapp::TraceRecord> buffers_[2]; // by step parity
  std::vector<uint64_t> marks_;               // resolver scratch
  int current_ = 0;
  int64_t step_ = 0;
  bool inStep_ = false;

  std::mutex mutex_;
  std::condition_variable work_, done_;
  bool queued_[2] = {false, false}; // buffer handed over, not yet appended
  int64_t queuedStep_[2] = {0, 0};
  bool stopping_ = false;
  std::string failure_;
  std::thread resolver_;
};

} // namespace mapp::rt

#endif

//===- TraceSink.cpp ------------------------------------------------------===//
#include "TraceSink.h"
#include "mapp/rt/Error.h"

using namespace mapp::rt;

TraceSink::TraceSink(Backend &backend, mapp::MappTraceWriter &writer,
                     size_t marksPerStep)
    : backend_(backend), writer_(writer),
      deferred_(backend.traceMarksDeferred()) {
  if (!deferred_)
    return;
  backend_.reserveTraceMarks(marksPerStep);
  // A record holds two marks.
  for (auto &b : buffers_)
    b.reserve(marksPerStep / 2 + 16);
  marks_.reserve(marksPerStep + 32);
  resolver_ = std::thread([this] { run(); });
}

TraceSink::~TraceSink() {
  if (!deferred_)
    return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_one();
  resolver_.join();
}

void TraceSink::appendMarked(const mapp::TraceRecord &r) {
  if (!deferred_) {
    writer_.append(r);
    return;
  }
  // Marks are only resolvable inside a step (the backend's anchor and end
  // events frame them); the executor traces nothing else with a deferred
  // backend.
  if (inStep_)
    buffers_[current_].push_back(r);
}

std::vector<mapp::TraceRecord> TraceSink::markedSince(size_t first) const {
  const std::vector<mapp::TraceRecord> &b = buffers_[current_];
  if (!deferred_ || !inStep_ || first > b.size())
    return {};
  return {b.begin() + static_cast<std::ptrdiff_t>(first), b.end()};
}

void TraceSink::beginStep(int64_t step) {
  if (!deferred_)
    return;
  step_ = step;
  current_ = static_cast<int>(step & 1);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return !queued_[current_] || !failure_.empty(); });
  }
  rethrowFailure();
  buffers_[current_].clear();
  inStep_ = true;
}

void TraceSink::endStep() {
  if (!deferred_)
    return;
  inStep_ = false;
  if (buffers_[current_].empty())
    return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_[current_] = true;
    queuedStep_[current_] = step_;
  }
  work_.notify_one();
}

void TraceSink::flush() {
  if (!deferred_)
    return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] {
      return (!queued_[0] && !queued_[1]) || !failure_.empty();
    });
  }
  rethrowFailure();
}

void TraceSink::rethrowFailure() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.empty())
    fail("trace: resolving device timestamps failed: ", failure_);
}

void TraceSink::resolve(std::vector<mapp::TraceRecord> &records) {
  marks_.clear();
  for (const mapp::TraceRecord &r : records) {
    marks_.push_back(r.beginNs);
    marks_.push_back(r.endNs);
  }
  backend_.resolveTraceMarks(marks_.data(), marks_.size());
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].beginNs = marks_[2 * i];
    records[i].endNs = marks_[2 * i + 1];
    writer_.append(records[i]);
  }
}

void TraceSink::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Oldest step first, so the file's append order follows the steps.
    int next = -1;
    for (int i = 0; i < 2; ++i)
      if (queued_[i] && (next < 0 || queuedStep_[i] < queuedStep_[next]))
        next = i;
    if (next < 0) {
      if (stopping_)
        return;
      work_.wait(lock);
      continue;
    }
    lock.unlock();
    std::string error;
    try {
      resolve(buffers_[next]);
    } catch (const std::exception &e) {
      error = e.what();
    }
    lock.lock();
    queued_[next] = false;
    if (!error.empty() && failure_.empty())
      failure_ = error;
    done_.notify_all();
  }
}

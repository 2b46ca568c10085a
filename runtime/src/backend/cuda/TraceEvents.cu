//===- TraceEvents.cu - CUDA events for MegaScan trace marks --------------===//
#include "TraceEvents.h"
#include "CudaCommon.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// A mark is its bank in the high bits and its event index below.
constexpr int kBankShift = 40;
constexpr uint64_t kIndexMask = (uint64_t(1) << kBankShift) - 1;

cudaEvent_t newTimingEvent() {
  // Timing on (cudaEventDisableTiming events have no timestamp), blocking
  // sync off: nothing ever waits on these events.
  cudaEvent_t e = nullptr;
  MAPP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  return e;
}

} // namespace

uint64_t mapp::rt::cuda::hostNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TraceEventPool::~TraceEventPool() {
  for (Bank &b : banks_) {
    for (cudaEvent_t e : b.events)
      cudaEventDestroy(e);
    if (b.anchor)
      cudaEventDestroy(b.anchor);
    if (b.end)
      cudaEventDestroy(b.end);
  }
}

void TraceEventPool::grow(Bank &b, size_t n) {
  while (b.events.size() < n)
    b.events.push_back(newTimingEvent());
}

void TraceEventPool::reserve(size_t marksPerStep) {
  for (Bank &b : banks_) {
    if (!b.anchor) {
      b.anchor = newTimingEvent();
      b.end = newTimingEvent();
    }
    b.events.reserve(marksPerStep);
    grow(b, marksPerStep);
  }
  armed_ = true;
}

void TraceEventPool::beginStep(cudaStream_t s) {
  if (!armed_)
    return;
  current_ ^= 1;
  Bank &b = banks_[current_];
  // The previous step ended with a stream synchronize, so the stream is
  // normally idle here and the anchor runs as soon as it is queued; the
  // query (no wait) tells whether that holds.
  b.idleAtAnchor = cudaStreamQuery(s) == cudaSuccess;
  b.anchorBeforeNs = hostNowNs();
  MAPP_CUDA_CHECK(cudaEventRecord(b.anchor, s));
  b.anchorAfterNs = hostNowNs();
  b.anchored = true;
  b.ended = false;
  b.syncNs = 0;
  b.used = 0;
}

uint64_t TraceEventPool::record(cudaStream_t s, bool capturing) {
  Bank &b = banks_[current_];
  if (b.used == b.events.size()) {
    b.events.push_back(newTimingEvent());
    ++grownMidStep_;
  }
  size_t i = b.used++;
  // In a capture, a plain record would only order the graph's nodes; an
  // external one is a node that records the event (with its timestamp) at
  // each launch.
  MAPP_CUDA_CHECK(cudaEventRecordWithFlags(
      b.events[i], s, capturing ? cudaEventRecordExternal : 0));
  return (static_cast<uint64_t>(current_) << kBankShift) | i;
}

void TraceEventPool::take(int bank, size_t first, size_t n) {
  Bank &b = banks_[current_];
  if (bank != current_ || b.used != first || first + n > b.events.size())
    fail("trace: a step graph's marks are [", first, ", ", first + n,
         ") of bank ", bank, " but the step records into bank ", current_,
         " with ", b.used, " of ", b.events.size(), " marks taken");
  b.used = first + n;
}

void TraceEventPool::endStep(cudaStream_t s) {
  Bank &b = banks_[current_];
  if (!b.anchored)
    return;
  MAPP_CUDA_CHECK(cudaEventRecord(b.end, s));
  b.ended = true;
}

void TraceEventPool::synchronized() {
  Bank &b = banks_[current_];
  if (b.ended && b.syncNs == 0)
    b.syncNs = hostNowNs();
}

void TraceEventPool::resolve(uint64_t *marks, size_t n) const {
  // Anchor host time per bank, computed on first use.
  double anchorNs[2] = {-1, -1};
  for (size_t k = 0; k < n; ++k) {
    int bank = static_cast<int>(marks[k] >> kBankShift);
    size_t index = marks[k] & kIndexMask;
    if (bank > 1 || index >= banks_[bank].used)
      fail("trace: mark ", marks[k], " was not recorded in the step");
    const Bank &b = banks_[bank];
    if (!b.anchored)
      fail("trace: marks resolved before their step began");
    if (anchorNs[bank] < 0) {
      double lower = static_cast<double>(b.anchorBeforeNs);
      double upper = std::numeric_limits<double>::infinity();
      if (b.ended && b.syncNs) {
        float endMs = 0;
        MAPP_CUDA_CHECK(cudaEventElapsedTime(&endMs, b.anchor, b.end));
        upper = static_cast<double>(b.syncNs) - static_cast<double>(endMs) * 1e6;
      }
      double guess = b.idleAtAnchor || std::isinf(upper)
                         ? static_cast<double>(b.anchorAfterNs)
                         : upper;
      anchorNs[bank] = std::max(lower, std::min(guess, upper));
    }
    float ms = 0;
    MAPP_CUDA_CHECK(cudaEventElapsedTime(&ms, b.anchor, b.events[index]));
    marks[k] = static_cast<uint64_t>(
        std::llround(anchorNs[bank] + static_cast<double>(ms) * 1e6));
  }
}

//===- ProbeCapture.h - asynchronous MegaScope capture (internal) -*- C++ -*-===//
//
// Probe kernels reduce on the compute stream into a slot of a device ring.
// Committed slots are contiguous in the ring until a flush (the step's end,
// a synchronize, a drain, a wrap of the ring or back-pressure): then a side
// stream, ordered after the reductions by one event, copies the whole run of
// slots with one cudaMemcpyAsync into the same offsets of a pinned host
// ring, and one event marks the copy done. A worker thread waits for it,
// decodes each slot into ProbeSamples and hands them to the ProbeRuntime
// (whose store writes SQLite on its own thread). The step never synchronizes
// the device for a probe: it waits only when the ring is full
// (back-pressure, no sample is dropped). Capacity: MAPP_PROBE_RING_BYTES
// (default 64 MiB). docs/megascope.md, "GPU capture".
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_PROBE_CAPTURE_H
#define MAPP_RT_CUDA_PROBE_CAPTURE_H

#include "CudaCommon.h"
#include "CudaHandles.h"
#include "mapp/rt/Probe.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace mapp::rt::cuda {

/// One reduction's result inside a slot and how the worker decodes it.
struct ResultField {
  enum Kind {
    Scalar, // one double at `offset`
    Floats, // `count` floats
    Counts, // `count` uint32 histogram counts
    TopKeys, // `count` uint64 keys: ordered value bits << 32 | ~index
    TokenProbs // `count` uint32 token ids, then (16-byte aligned) `count`
               // float probabilities: the lens's [positions, k]
  };
  std::string reduction;
  Kind kind = Scalar;
  size_t offset = 0;
  int64_t count = 0;
  Shape shape;
};

/// Where a TokenProbs field's probabilities start, from its ids.
inline size_t tokenProbsOffset(int64_t count) {
  return (static_cast<size_t>(count) * 4 + 15) / 16 * 16;
}

/// Device copies of per-instr constants (token positions, mask channels,
/// sketch projections), uploaded once: a pageable upload inside the step
/// would synchronize the stream.
class DeviceConstants {
public:
  /// `values` on the device, cached under (`owner`, `tag`).
  const int64_t *ints(const void *owner, int tag,
                      const std::vector<int64_t> &values);
  /// The sketch projection R[dim][inner] (docs/megascope.md) of `seed`.
  const double *projection(uint64_t seed, int64_t dim, int64_t inner,
                           cudaStream_t s);
  ~DeviceConstants();

private:
  struct Ints {
    std::vector<int64_t> host;
    int64_t *dev = nullptr;
  };
  std::map<std::pair<const void *, int>, Ints> ints_;
  std::map<std::tuple<uint64_t, int64_t, int64_t>, double *> proj_;
};

/// Everything one probe instr's call derives from its attrs and input type
/// (Probe.cu); built at the first call and reused while both stay the same,
/// so a call parses nothing and allocates nothing on the host.
struct ProbeCallPlan;

class ProbeCapture {
public:
  /// ringBytes: MAPP_PROBE_RING_BYTES (CudaConfig::probeRingBytes).
  ProbeCapture(int device, cudaStream_t compute, size_t ringBytes);
  ~ProbeCapture();
  ProbeCapture(const ProbeCapture &) = delete;
  ProbeCapture &operator=(const ProbeCapture &) = delete;

  /// Rounds `bytes` up to a slot size (what reserve() takes of the ring).
  static size_t slotBytes(size_t bytes);
  /// `bytes` of device ring for one probe call; waits for older slots to
  /// reach the host when the ring is full (after flushing the pending
  /// ones). The caller checks slotBytes(bytes) <= capacity() first (its
  /// error names the probe); this one only guards.
  uint8_t *reserve(size_t bytes);
  /// The slot from reserve() joins the pending run that the next flush()
  /// copies to the host; the worker then turns it into samples. `fields`
  /// is shared with the call plan (no copy per call).
  void commit(std::shared_ptr<const std::vector<ResultField>> fields,
              ProbeRuntime *rt, int64_t probeId, int64_t step, int microbatch);
  /// Gives back the slot of the last reserve() when its kernels could not
  /// be queued (its bytes are copied with the run, nothing is recorded).
  void cancel();
  /// Queues the copy of every committed slot not yet copied: one event on
  /// the compute stream, one copy and one event on the side stream.
  void flush();
  /// Flushes, then waits until every committed slot reached its runtime;
  /// rethrows what the worker caught.
  void drain();

  /// Device scratch `which` (0..2) of at least `bytes` for the reductions,
  /// grown (with a stream sync) only in the first steps.
  void *work(size_t bytes, int which);
  /// Device scratch of at least `bytes` that is all zero whenever no probe
  /// kernel runs: the single-launch reductions count finished blocks and
  /// histogram bins in it and their last block zeroes what it used.
  void *zeroedWork(size_t bytes);
  DeviceConstants &constants() { return constants_; }
  size_t capacity() const { return cap_; }
  /// The cached plan of the probe instr with `attrs` (null before its
  /// first call); Probe.cu validates and fills it.
  std::shared_ptr<ProbeCallPlan> &plan(const void *attrs) { return plans_[attrs]; }

private:
  struct Entry {
    size_t start = 0, bytes = 0;
    bool committed = false; // results queued on the compute stream
    bool queued = false;    // its run's copy is queued (flush)
    bool ownsEvents = false; // the last slot of its run recycles the events
    std::shared_ptr<const std::vector<ResultField>> fields;
    ProbeRuntime *rt = nullptr;
    int64_t probeId = 0, step = 0;
    int microbatch = 0;
    cudaEvent_t ready = nullptr, copied = nullptr;
  };
  void workerLoop();
  void decode(const Entry &e);
  cudaEvent_t takeEvent();
  void flushLocked();

  int device_;
  cudaStream_t compute_;
  Stream side_; // owned (CudaHandles.h), destroyed after the rings
  size_t cap_;
  DeviceBuffer<uint8_t> devRing_;
  PinnedBuffer<uint8_t> hostRing_;
  size_t head_ = 0;
  size_t pending_ = 0; // committed slots at the back not yet flushed
  std::mutex mu_;
  std::condition_variable work_, freed_;
  std::deque<Entry> entries_; // oldest first; the worker pops the front
  std::vector<cudaEvent_t> spareEvents_;
  bool stop_ = false;
  std::string error_;
  std::thread worker_;
  struct Scratch {
    void *p = nullptr;
    size_t bytes = 0;
  };
  Scratch scratch_[3], zeroed_;
  DeviceConstants constants_;
  std::unordered_map<const void *, std::shared_ptr<ProbeCallPlan>> plans_;
};

} // namespace mapp::rt::cuda

#endif

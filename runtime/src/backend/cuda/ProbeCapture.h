//===- ProbeCapture.h - asynchronous MegaScope capture (internal) -*- C++ -*-===//
//
// Probe kernels reduce on the compute stream into a slot of a device ring;
// a side stream, ordered after the reductions by an event, copies the slot
// into the same offsets of a pinned host ring; a worker thread waits for the
// copy's event, decodes the slot into ProbeSamples and hands them to the
// ProbeRuntime (whose store writes SQLite on its own thread). The step never
// synchronizes the device for a probe: it waits only when the ring is full
// (back-pressure, no sample is dropped). Capacity: MAPP_PROBE_RING_BYTES
// (default 64 MiB). docs/megascope.md, "GPU capture".
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_PROBE_CAPTURE_H
#define MAPP_RT_CUDA_PROBE_CAPTURE_H

#include "CudaCommon.h"
#include "mapp/rt/Probe.h"

#include <condition_variable>
#include <deque>
#include <map>
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
    TopKeys // `count` uint64 keys: ordered value bits << 32 | ~index
  };
  std::string reduction;
  Kind kind = Scalar;
  size_t offset = 0;
  int64_t count = 0;
  Shape shape;
};

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

class ProbeCapture {
public:
  ProbeCapture(int device, cudaStream_t compute);
  ~ProbeCapture();
  ProbeCapture(const ProbeCapture &) = delete;
  ProbeCapture &operator=(const ProbeCapture &) = delete;

  /// `bytes` of device ring for one probe call; waits for older slots to
  /// reach the host when the ring is full. Error when a call needs more
  /// than the whole ring (`what` names the probe).
  uint8_t *reserve(size_t bytes, const std::string &what);
  /// Copies the slot from reserve() to the host once the work queued so far
  /// on the compute stream is done; the worker turns it into samples.
  void commit(std::vector<ResultField> fields, ProbeRuntime *rt,
              int64_t probeId, int64_t step, int microbatch);
  /// Gives back the slot of the last reserve() when its kernels could not
  /// be queued (nothing is copied or recorded for it).
  void cancel();
  /// Waits until every committed slot reached its runtime; rethrows what
  /// the worker caught.
  void drain();

  /// Device scratch `which` (0..2) of at least `bytes` for the reductions,
  /// grown (with a stream sync) only in the first steps.
  void *work(size_t bytes, int which);
  DeviceConstants &constants() { return constants_; }
  size_t capacity() const { return cap_; }

private:
  struct Entry {
    size_t start = 0, bytes = 0;
    bool committed = false;
    std::vector<ResultField> fields;
    ProbeRuntime *rt = nullptr;
    int64_t probeId = 0, step = 0;
    int microbatch = 0;
    cudaEvent_t ready = nullptr, copied = nullptr;
  };
  void workerLoop();
  void decode(const Entry &e);
  cudaEvent_t takeEvent();

  int device_;
  cudaStream_t compute_, side_ = nullptr;
  size_t cap_;
  uint8_t *devRing_ = nullptr, *hostRing_ = nullptr;
  size_t head_ = 0;
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
  Scratch scratch_[3];
  DeviceConstants constants_;
};

} // namespace mapp::rt::cuda

#endif

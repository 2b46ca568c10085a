//===- ProbeCapture.cu - device ring, pinned ring, capture worker ---------===//
#include "ProbeCapture.h"
#include "CudaBackend.h"
#include "ProbeRngDevice.cuh"

#include <cstdlib>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr size_t kSlotAlign = 256;

__global__ void projectionKernel(double *r, uint64_t seed, int64_t n,
                                 double scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    r[i] = device_rng::normal(seed, static_cast<uint64_t>(i)) * scale;
}

float unorderedFloat(uint32_t o) {
  uint32_t bits = (o & 0x80000000u) ? (o ^ 0x80000000u) : ~o;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

} // namespace

const int64_t *DeviceConstants::ints(const void *owner, int tag,
                                     const std::vector<int64_t> &values) {
  Ints &c = ints_[{owner, tag}];
  if (c.dev && c.host == values)
    return c.dev;
  // First call of this instr (or its attrs changed): a synchronous upload.
  if (c.dev)
    MAPP_CUDA_CHECK(cudaFree(c.dev));
  c.host = values;
  MAPP_CUDA_CHECK(cudaMalloc(&c.dev, std::max<size_t>(values.size(), 1) * 8));
  if (!values.empty())
    MAPP_CUDA_CHECK(cudaMemcpy(c.dev, values.data(), values.size() * 8,
                               cudaMemcpyHostToDevice));
  return c.dev;
}

const double *DeviceConstants::projection(uint64_t seed, int64_t dim,
                                          int64_t inner, cudaStream_t s) {
  double *&r = proj_[{seed, dim, inner}];
  if (!r) {
    int64_t n = dim * inner;
    MAPP_CUDA_CHECK(cudaMalloc(&r, std::max<int64_t>(n, 1) * sizeof(double)));
    projectionKernel<<<gridFor(n, 256), 256, 0, s>>>(
        r, seed, n, 1.0 / std::sqrt(static_cast<double>(dim)));
    MAPP_CUDA_LAUNCHED();
  }
  return r;
}

DeviceConstants::~DeviceConstants() {
  for (auto &kv : ints_)
    cudaFree(kv.second.dev);
  for (auto &kv : proj_)
    cudaFree(kv.second);
}

ProbeCapture::ProbeCapture(int device, cudaStream_t compute, size_t ringBytes)
    : device_(device), compute_(compute), cap_(ringBytes) {
  MAPP_CUDA_CHECK(cudaStreamCreateWithFlags(side_.out(), cudaStreamNonBlocking));
  worker_ = std::thread([this] { workerLoop(); });
}

ProbeCapture::~ProbeCapture() {
  {
    std::lock_guard<std::mutex> l(mu_);
    try {
      flushLocked(); // committed samples still reach their runtime
    } catch (const std::exception &) {
      // The device failed: the worker reports nothing more.
    }
    stop_ = true;
  }
  work_.notify_all();
  worker_.join();
  for (Entry &e : entries_)
    if (e.ownsEvents) {
      cudaEventDestroy(e.ready);
      cudaEventDestroy(e.copied);
    }
  for (cudaEvent_t e : spareEvents_)
    cudaEventDestroy(e);
  for (Scratch &s : scratch_)
    cudaFree(s.p);
  cudaFree(zeroed_.p);
  cudaStreamSynchronize(side_); // the rings and the stream go after this
}

cudaEvent_t ProbeCapture::takeEvent() {
  if (!spareEvents_.empty()) {
    cudaEvent_t e = spareEvents_.back();
    spareEvents_.pop_back();
    return e;
  }
  cudaEvent_t e;
  // Blocking sync: the worker sleeps instead of spinning on a CPU core.
  MAPP_CUDA_CHECK(cudaEventCreateWithFlags(
      &e, cudaEventDisableTiming | cudaEventBlockingSync));
  return e;
}

size_t ProbeCapture::slotBytes(size_t bytes) {
  return (std::max<size_t>(bytes, 1) + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
}

uint8_t *ProbeCapture::reserve(size_t bytes) {
  bytes = slotBytes(bytes);
  if (bytes > cap_)
    fail("a probe call needs ", bytes, " bytes of capture ring, more than "
         "MAPP_PROBE_RING_BYTES=", cap_);
  if (!devRing_) { // perturbation-only plans never capture
    MAPP_CUDA_CHECK(cudaMalloc(devRing_.out(), cap_));
    MAPP_CUDA_CHECK(cudaMallocHost(hostRing_.out(), cap_));
  }
  std::unique_lock<std::mutex> l(mu_);
  size_t start = 0;
  // Slots are taken and freed in order: the free space is [head, tail) or
  // [head, cap) + [0, tail) where tail is the oldest slot still in use.
  auto fits = [&] {
    if (!error_.empty())
      return true;
    if (entries_.empty()) {
      start = 0;
      return true;
    }
    size_t tail = entries_.front().start;
    if (head_ > tail) {
      if (cap_ - head_ >= bytes) {
        start = head_;
        return true;
      }
      if (tail >= bytes) {
        start = 0;
        return true;
      }
      return false;
    }
    if (tail - head_ >= bytes) {
      start = head_;
      return true;
    }
    return false;
  };
  // A run copied by one flush is contiguous; space is freed only after a
  // flush, so flush before waiting for it.
  if (!fits()) {
    flushLocked();
    freed_.wait(l, fits);
  } else if (pending_ && start != head_) {
    flushLocked(); // the ring wrapped
  }
  if (!error_.empty())
    fail("probe capture: ", error_);
  Entry e;
  e.start = start;
  e.bytes = bytes;
  entries_.push_back(std::move(e));
  head_ = start + bytes;
  ++pending_;
  return devRing_ + start;
}

void ProbeCapture::commit(std::shared_ptr<const std::vector<ResultField>> fields,
                          ProbeRuntime *rt, int64_t probeId, int64_t step,
                          int microbatch) {
  std::lock_guard<std::mutex> l(mu_);
  Entry &e = entries_.back();
  e.fields = std::move(fields);
  e.rt = rt;
  e.probeId = probeId;
  e.step = step;
  e.microbatch = microbatch;
  e.committed = true;
}

void ProbeCapture::cancel() {
  std::lock_guard<std::mutex> l(mu_);
  Entry &e = entries_.back();
  e.fields.reset(); // copied with its run, decoded into nothing
  e.committed = true;
}

void ProbeCapture::flushLocked() {
  // A slot reserved but not yet committed (a flush from inside a probe
  // call) waits for the next run.
  size_t runLength = pending_;
  if (runLength && !entries_.back().committed)
    --runLength;
  if (!runLength)
    return;
  size_t first = entries_.size() - pending_, end = first + runLength;
  size_t from = entries_[first].start;
  Entry &last = entries_[end - 1];
  size_t to = last.start + last.bytes;
  cudaEvent_t ready = takeEvent(), copied = takeEvent();
  // The events go back to the spares with the run's last slot.
  last.ready = ready;
  last.copied = copied;
  last.ownsEvents = true;
  MAPP_CUDA_CHECK(cudaEventRecord(ready, compute_));
  MAPP_CUDA_CHECK(cudaStreamWaitEvent(side_, ready, 0));
  MAPP_CUDA_CHECK(cudaMemcpyAsync(hostRing_ + from, devRing_ + from, to - from,
                                  cudaMemcpyDeviceToHost, side_));
  MAPP_CUDA_CHECK(cudaEventRecord(copied, side_));
  for (size_t i = first; i < end; ++i) {
    entries_[i].copied = copied;
    entries_[i].queued = true;
  }
  pending_ -= runLength;
  work_.notify_one();
}

void ProbeCapture::flush() {
  std::lock_guard<std::mutex> l(mu_);
  flushLocked();
}

void ProbeCapture::drain() {
  std::unique_lock<std::mutex> l(mu_);
  flushLocked();
  freed_.wait(l, [&] { return entries_.empty() || !error_.empty(); });
  if (!error_.empty()) {
    std::string m = error_;
    error_.clear();
    fail("probe capture: ", m);
  }
}

void *ProbeCapture::work(size_t bytes, int which) {
  Scratch &s = scratch_[which];
  if (s.bytes < bytes) {
    MAPP_CUDA_CHECK(cudaStreamSynchronize(compute_));
    MAPP_CUDA_CHECK(cudaFree(s.p));
    s.bytes = std::max(bytes, s.bytes * 2);
    MAPP_CUDA_CHECK(cudaMalloc(&s.p, s.bytes));
  }
  return s.p;
}

void *ProbeCapture::zeroedWork(size_t bytes) {
  Scratch &s = zeroed_;
  if (s.bytes < bytes) {
    MAPP_CUDA_CHECK(cudaStreamSynchronize(compute_));
    MAPP_CUDA_CHECK(cudaFree(s.p));
    s.bytes = std::max(bytes, s.bytes * 2);
    MAPP_CUDA_CHECK(cudaMalloc(&s.p, s.bytes));
    MAPP_CUDA_CHECK(cudaMemset(s.p, 0, s.bytes));
  }
  return s.p;
}

void ProbeCapture::workerLoop() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_.wait(l, [&] {
      return stop_ || (!entries_.empty() && entries_.front().queued);
    });
    if (entries_.empty() || !entries_.front().queued) {
      if (stop_)
        return;
      continue;
    }
    // The front entry stays in place (its ring bytes stay reserved) while
    // it is decoded without the lock.
    Entry &e = entries_.front();
    l.unlock();
    std::string err;
    // Slots of one run share the event: after the first it returns at once.
    cudaError_t ce = cudaEventSynchronize(e.copied);
    if (ce != cudaSuccess) {
      err = std::string("copying probe results to the host: ") +
            cudaGetErrorString(ce);
    } else if (e.fields) {
      try {
        decode(e);
      } catch (const std::exception &x) {
        err = x.what();
      }
    }
    l.lock();
    if (!err.empty() && error_.empty())
      error_ = err;
    if (e.ownsEvents) {
      spareEvents_.push_back(e.ready);
      spareEvents_.push_back(e.copied);
    }
    entries_.pop_front();
    if (entries_.empty())
      head_ = 0;
    freed_.notify_all();
  }
}

void ProbeCapture::decode(const Entry &e) {
  const uint8_t *slot = hostRing_ + e.start;
  for (const ResultField &f : *e.fields) {
    ProbeSample s;
    s.probeId = e.probeId;
    s.step = e.step;
    s.microbatch = e.microbatch;
    s.reduction = f.reduction;
    s.shape = f.shape;
    const uint8_t *p = slot + f.offset;
    switch (f.kind) {
    case ResultField::Scalar:
      std::memcpy(&s.value, p, sizeof(double));
      break;
    case ResultField::Floats:
      s.data.resize(f.count);
      std::memcpy(s.data.data(), p, f.count * sizeof(float));
      break;
    case ResultField::Counts: {
      const uint32_t *c = reinterpret_cast<const uint32_t *>(p);
      s.data.assign(c, c + f.count);
      break;
    }
    case ResultField::TopKeys: {
      const uint64_t *k = reinterpret_cast<const uint64_t *>(p);
      for (int64_t i = 0; i < f.count; ++i) {
        if (!k[i])
          break; // fewer than k non-NaN elements
        s.data.push_back(unorderedFloat(static_cast<uint32_t>(k[i] >> 32)));
        s.index.push_back(0xFFFFFFFFll - static_cast<int64_t>(k[i] & 0xFFFFFFFFu));
      }
      s.shape = {static_cast<int64_t>(s.data.size())};
      break;
    }
    case ResultField::TokenProbs: {
      const uint32_t *ids = reinterpret_cast<const uint32_t *>(p);
      const float *probs =
          reinterpret_cast<const float *>(p + tokenProbsOffset(f.count));
      s.index.assign(ids, ids + f.count);
      s.data.assign(probs, probs + f.count);
      break;
    }
    }
    e.rt->record(std::move(s));
  }
}

// The backend's hooks live here so CudaBackend.cu only owns the pointer.
ProbeCapture &CudaBackend::probeCapture() {
  if (!capture_)
    capture_ =
        std::make_unique<ProbeCapture>(device_, stream_, config_.probeRingBytes);
  return *capture_;
}

void CudaBackend::drainProbes() {
  if (capture_)
    capture_->drain();
}

void CudaBackend::flushProbes() {
  if (capture_)
    capture_->flush();
}

//===- CudaHandles.h - owning wrappers of CUDA resources --------*- C++ -*-===//
//
// Streams, events, cuBLASLt handles and device / pinned buffers of the CUDA
// backend, each released exactly once by its owner's destructor. Release
// errors are ignored there (a destructor must not throw; the process is
// usually ending); code that must see them calls release() and checks.
// Each converts to the raw handle, so CUDA calls take it unchanged.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_HANDLES_H
#define MAPP_RT_CUDA_HANDLES_H

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <utility>

namespace mapp::rt::cuda {

/// Owns one handle (null: nothing); Destroy(handle) releases it.
template <typename Handle, auto Destroy> class Owned {
public:
  Owned() = default;
  explicit Owned(Handle h) : h_(h) {}
  Owned(const Owned &) = delete;
  Owned &operator=(const Owned &) = delete;
  Owned(Owned &&o) noexcept : h_(std::exchange(o.h_, Handle{})) {}
  Owned &operator=(Owned &&o) noexcept {
    if (this != &o)
      reset(std::exchange(o.h_, Handle{}));
    return *this;
  }
  ~Owned() { reset(); }

  /// Releases the current handle (errors ignored), then owns h.
  void reset(Handle h = Handle{}) noexcept {
    if (h_)
      (void)Destroy(h_);
    h_ = h;
  }
  /// Gives the handle up without releasing it.
  Handle release() noexcept { return std::exchange(h_, Handle{}); }
  /// Where a create call writes the new handle (the old one is released).
  Handle *out() noexcept {
    reset();
    return &h_;
  }
  Handle get() const { return h_; }
  operator Handle() const { return h_; }
  Handle operator->() const { return h_; }

private:
  Handle h_{};
};

template <typename T> cudaError_t freeDevice(T *p) { return cudaFree(p); }
template <typename T> cudaError_t freePinned(T *p) { return cudaFreeHost(p); }

using Stream = Owned<cudaStream_t, cudaStreamDestroy>;
using Event = Owned<cudaEvent_t, cudaEventDestroy>;
using LtHandle = Owned<cublasLtHandle_t, cublasLtDestroy>;
/// cudaMalloc'd memory.
using GraphExec = Owned<cudaGraphExec_t, cudaGraphExecDestroy>;
template <typename T> using DeviceBuffer = Owned<T *, freeDevice<T>>;
/// cudaMallocHost'd (pinned) memory.
template <typename T> using PinnedBuffer = Owned<T *, freePinned<T>>;

} // namespace mapp::rt::cuda

#endif

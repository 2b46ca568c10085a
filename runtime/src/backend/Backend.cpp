//===- Backend.cpp - backend selection and host-memory defaults -----------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <chrono>
#include <cstring>

using namespace mapp::rt;

void Backend::copyToStorage(void *dst, const void *src, size_t bytes) {
  if (bytes)
    std::memcpy(dst, src, bytes);
}

void Backend::readFloats(const Program &, int, const void *src,
                         int64_t offset, int64_t n, float *dst) {
  copyFromStorage(dst, static_cast<const float *>(src) + offset,
                  static_cast<size_t>(n) * sizeof(float));
}

void Backend::writeFloats(const Program &, int, void *dst, int64_t offset,
                          int64_t n, const float *src) {
  copyToStorage(static_cast<float *>(dst) + offset, src,
                static_cast<size_t>(n) * sizeof(float));
}

size_t Backend::postedRecvBytes(Communicator &, const Value &v) {
  return static_cast<size_t>(v.type.numel()) * dtypeSize(v.type.dtype);
}

void Backend::copyFromStorage(void *dst, const void *src, size_t bytes) {
  if (bytes)
    std::memcpy(dst, src, bytes);
}

void Backend::readScalarAsync(float *dst, const void *src) {
  std::memcpy(dst, src, sizeof(float));
}

void Backend::zeroStorage(void *dst, size_t bytes) {
  if (bytes)
    std::memset(dst, 0, bytes);
}

double Backend::sumSquares(const std::vector<Tensor> &ts) {
  double s = 0;
  for (const Tensor &t : ts) {
    const float *g = t.f32();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      s += static_cast<double>(g[i]) * g[i];
  }
  return s;
}

uint64_t Backend::traceMark() {
  // The clock of MappTraceWriter::nowNs (steady_clock), which every host
  // trace time uses.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#ifndef MAPP_HAVE_CUDA
std::unique_ptr<Backend> mapp::rt::createCudaBackend(int) {
  fail("--backend=cuda is not built into this runtime (configure with "
       "MAPP_ENABLE_CUDA=ON where nvcc is found)");
}
bool mapp::rt::cudaBackendBuilt() { return false; }
std::vector<std::string> mapp::rt::cudaKernelNames() { return {}; }
#endif

std::unique_ptr<Backend> mapp::rt::createBackend(const std::string &name,
                                                 int threads, int device) {
  if (name == "cpu")
    return createCpuBackend(threads);
  if (name == "cuda")
    return createCudaBackend(device);
  fail("unknown backend '", name, "' (choices: cpu",
       cudaBackendBuilt() ? ", cuda" : "", ")");
}

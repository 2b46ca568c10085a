//===- Backend.cpp - backend selection and host-memory defaults -----------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"

#include <cstring>

using namespace mapp::rt;

void Backend::copyToStorage(void *dst, const void *src, size_t bytes) {
  if (bytes)
    std::memcpy(dst, src, bytes);
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

#ifndef MAPP_HAVE_CUDA
std::unique_ptr<Backend> mapp::rt::createCudaBackend(int) {
  fail("--backend=cuda is not built into this runtime (configure with "
       "MAPP_ENABLE_CUDA=ON where nvcc is found)");
}
bool mapp::rt::cudaBackendBuilt() { return false; }
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

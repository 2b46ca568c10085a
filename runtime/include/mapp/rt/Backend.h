//===- Backend.h - kernel providers -----------------------------*- C++ -*-===//
//
// A backend maps kernel names to KernelFn once, at load time; the executor
// then calls function pointers. Storage is plain host memory for the CPU
// backend; a device backend will override allocate/free and the copies.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKEND_H
#define MAPP_RT_BACKEND_H

#include "mapp/rt/Kernels.h"

#include <memory>
#include <string>

namespace mapp::rt {

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// Null when this backend has no implementation of `kernel`.
  virtual KernelFn lookup(const std::string &kernel) const = 0;
  /// Zero-initialized storage of `bytes`, 64-byte aligned.
  virtual void *allocate(size_t bytes) = 0;
  virtual void release(void *p) = 0;
  virtual ThreadPool &pool() = 0;
};

/// fp32 reference kernels with `threads` workers (0 = hardware threads).
std::unique_ptr<Backend> createCpuBackend(int threads);
/// Backend by name ("cpu"); Error naming the choices otherwise.
std::unique_ptr<Backend> createBackend(const std::string &name, int threads);

} // namespace mapp::rt

#endif

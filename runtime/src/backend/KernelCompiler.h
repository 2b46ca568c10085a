//===- KernelCompiler.h - NVRTC and the kernel cache (internal) -*- C++ -*-===//
//
// Generated CUDA source (FusedCodegen.h) → a cubin: NVRTC through dlopen
// (like cuDNN: no link-time dependency, so the runtime builds and the
// no-GPU checks run where the toolkit is absent; a clear error when it is),
// and a cache on disk keyed by (source, arch, NVRTC version) so later runs
// skip compilation. Plain C++ (no CUDA headers): the host check
// (FusedCodegenCheck) compiles every generated kernel with it.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKEND_KERNELCOMPILER_H
#define MAPP_RT_BACKEND_KERNELCOMPILER_H

#include <string>

namespace mapp::rt {

/// NVRTC, loaded once (MAPP_NVRTC_LIB, then libnvrtc.so.13, .12, libnvrtc.so).
class Nvrtc {
public:
  /// The library, or null with `why` (every name tried and its dlerror).
  static const Nvrtc *load(std::string &why);
  /// "13.0".
  std::string version() const;
  /// Compiles `source` for sm_<arch> into `cubin`; false with `log` (NVRTC's
  /// log, or the failing call) otherwise.
  bool compile(const std::string &source, const std::string &name, int arch,
               std::string &cubin, std::string &log) const;

  struct Api;

private:
  const Api *api_ = nullptr;
};

/// The cache folder: $MAPP_KERNEL_CACHE, else $XDG_CACHE_HOME/mapp/kernels,
/// else $HOME/.cache/mapp/kernels ("" when none is set).
std::string kernelCacheDir();

struct CompiledKernel {
  std::string cubin;
  bool fromCache = false;
};

/// The cubin of `source` for sm_<arch>: read from the cache when an entry
/// with the same key is there, else compiled with NVRTC and stored (an
/// unwritable cache is reported once on stderr and skipped). Throws Error
/// naming `what` (the instruction) with NVRTC's log when it does not
/// compile, or why NVRTC is unavailable.
CompiledKernel compileKernel(const std::string &source, int arch, const std::string &what);

} // namespace mapp::rt

#endif

//===- FusedKernels.h - generated kernels of mapp.fused (internal) -*- C++ -*-//
//
// The CUDA evaluation of `fused` instructions (docs/fusion.md): at bind
// (plan load, before step 1) every distinct program of the program bound —
// with its domain's rank and its operands' storage types — gets its source
// generated (FusedCodegen.h), compiled once with NVRTC for the device's
// arch or read from the kernel cache (KernelCompiler.h), and loaded; the
// `fused` kernel then only fills the argument block and launches.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_FUSEDKERNELS_H
#define MAPP_RT_CUDA_FUSEDKERNELS_H

#include "CudaCommon.h"
#include "mapp/rt/FusedCodegen.h"
#include "mapp/rt/Plan.h"

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace mapp::rt::cuda {

class CudaBackend;

class FusedKernels {
public:
  /// Compiles (or reads from the cache) and loads the kernels of every
  /// `fused` instruction of `p` (none without a program: a call outside a
  /// bound program, as the kernel tests make, is prepared when it comes);
  /// throws Error naming the instruction.
  FusedKernels(CudaBackend &be, const Program *p);
  ~FusedKernels();
  FusedKernels(const FusedKernels &) = delete;
  FusedKernels &operator=(const FusedKernels &) = delete;

  /// Runs one `fused` call on the backend's stream.
  void run(CudaBackend &be, const KernelArgs &a);

  /// Kernels compiled and read from the cache at bind (--fuse log, tests).
  int compiled() const { return compiled_; }
  int cached() const { return cached_; }

private:
  struct Loaded {
    cudaLibrary_t library = nullptr;
    cudaKernel_t kernel = nullptr;
    int width = 4; // elements per thread of its vector path (vectorWidth)
  };
  struct Call {
    fused::Program program;
    std::vector<int64_t> domain, outputs;
    std::string text; // the program, as the attribute says
    std::string what; // names the instruction in errors
    // The kernel for these storage types (set at bind or by the first call).
    std::vector<DType> inputs, results;
    cudaKernel_t kernel = nullptr;
    int width = 4; // elements per thread of its vector path (vectorWidth)
  };
  static Call prepare(const Attrs &attrs, int numInputs, const std::string &what);
  /// The kernel for `spec`: loaded before, or generated, compiled, loaded.
  cudaKernel_t kernelFor(const fused::CodegenSpec &spec, const std::string &what);

  int arch_ = 0;
  int compiled_ = 0, cached_ = 0;
  std::map<std::string, Loaded> bySource_;
  std::unordered_map<const Attrs *, Call> calls_;
};

} // namespace mapp::rt::cuda

#endif

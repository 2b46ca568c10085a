//===- FusedKernels.h - generated kernels of mapp.fused (internal) -*- C++ -*-//
//
// The CUDA evaluation of `fused` instructions (docs/fusion.md): at bind
// (plan load, before step 1) every distinct program of the program bound —
// with its domain's rank and its operands' storage types — gets its source
// generated (FusedCodegen.h), compiled once with NVRTC for the device's
// arch or read from the kernel cache (KernelCompiler.h), and loaded; the
// `fused` kernel then only fills the argument block and launches.
//
// The pointwise kernels of the vocabulary (add, mul, silu, select, ...,
// grad_accumulate) run the same way, as one-statement programs: the CUDA
// backend has no hand-written pointwise kernel.
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
  /// Runs pointwise kernel `op` of the vocabulary (its immediate from the
  /// call's attributes) as a generated one-statement program; with
  /// `accumulate`, out[0] += in[0] (grad_accumulate).
  void runPointwise(CudaBackend &be, const KernelArgs &a, fused::Op op,
                    bool accumulate = false);

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
    bool bound = false; // prepared at bind, for an instruction of the program
  };
  static Call prepare(const std::string &program, std::vector<int64_t> domain,
                      std::vector<int64_t> outputs, int numInputs, const std::string &what);
  /// Binds `c` to the kernel for these storage types, unless it has it.
  void bind(Call &c, const std::vector<DType> &inputs, const std::vector<DType> &results);
  /// Launches c's kernel over its domain, operands of these shapes.
  void launch(CudaBackend &be, const Call &c, const std::vector<std::vector<int64_t>> &shapes,
              const std::vector<const void *> &ins, const std::vector<void *> &outs);
  /// The kernel for `spec`: loaded before, or generated, compiled, loaded.
  cudaKernel_t kernelFor(const fused::CodegenSpec &spec, const std::string &what);

  int arch_ = 0;
  int compiled_ = 0, cached_ = 0;
  std::map<std::string, Loaded> bySource_;
  std::unordered_map<const Attrs *, Call> calls_;
};

} // namespace mapp::rt::cuda

#endif

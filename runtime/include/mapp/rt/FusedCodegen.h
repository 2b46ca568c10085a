//===- FusedCodegen.h - CUDA source for a mapp.fused program ----*- C++ -*-===//
//
// The kernel generator of `mapp.fused` (docs/fusion.md, "CUDA: generated
// kernels"): a program, the rank of its domain and the storage type of each
// operand and result → the text of one translation unit holding one
// `extern "C" __global__` kernel: straight-line code per statement (each a
// call of fused::apply with a constant op, folded by the compiler), every
// operand loaded through its broadcast strides (kernel arguments, so one
// kernel serves every shape of the program), results stored per `outputs`,
// a trailing reduce_sum as a deterministic block tree (FusedDevice.h), a
// row program as one block per row with a pass per reduce_sum; on
// the flat path 16-byte vector loads and stores (vectorWidth). The
// text embeds FusedDevice.h, so NVRTC needs no include path and the math
// has one copy. Plain C++: the compiler-free check of the generator
// (FusedCodegenCheck) builds the same text as host C++.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FUSEDCODEGEN_H
#define MAPP_RT_FUSEDCODEGEN_H

#include "mapp/rt/DType.h"
#include "mapp/rt/FusedProgram.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt::fused {

/// What one generated kernel is specialized for.
struct CodegenSpec {
  Program program;
  int rank = 0;                 // of the domain
  std::vector<int64_t> outputs; // per result, its statement
  std::vector<DType> inputs;    // storage of each operand (F32 or BF16)
  std::vector<DType> results;   // storage of each result
};

/// The kernel's entry point in generated source.
constexpr const char *kKernelEntry = "mapp_fused";

/// The text of FusedDevice.h, embedded at build time.
const char *deviceHeaderText();

/// Elements per thread of the vector path (KernelParams::vec): 16 bytes of
/// the narrowest storage, 8 when any operand or result is bf16, else 4.
int vectorWidth(const CodegenSpec &spec);

/// One kernel's source. `entry` names the kernel; `host` emits a host
/// function `extern "C" void entry(const KernelParams *)` instead of the
/// `__global__` kernel (running the device loops' order, FusedDevice.h
/// hostLoop) for the host check. Throws Error when the spec is beyond the
/// generator (storage other than f32/bf16, a limit of FusedDevice.h).
std::string generateKernel(const CodegenSpec &spec, const std::string &entry = kKernelEntry,
                           bool host = false);

/// The argument block for one call: `domain`, the operands' and results'
/// shapes (NumPy-broadcast to the domain) and their data. Throws Error when
/// an operand does not broadcast to the domain.
KernelParams kernelParams(const Program &program, const std::vector<int64_t> &domain,
                          const std::vector<std::vector<int64_t>> &inputShapes,
                          const std::vector<const void *> &inputs,
                          const std::vector<void *> &results);

} // namespace mapp::rt::fused

#endif

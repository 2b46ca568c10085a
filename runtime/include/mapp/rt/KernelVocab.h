//===- KernelVocab.h - the kernel names plans may use -----------*- C++ -*-===//
//
// KernelVocab.def as a constexpr table: names, properties and per-backend
// support. Header-only and dependency-free so the compiler's plan builder
// can include it without linking the runtime (the runtime never includes
// MLIR; the compiler may include this plain header).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_KERNELVOCAB_H
#define MAPP_RT_KERNELVOCAB_H

#include <cstddef>
#include <string_view>

namespace mapp::rt {

/// What the runtime and the backends need to know about a kernel beyond its
/// operand rules (bits of KernelInfo::props).
enum KernelProp : unsigned {
  kNoProps = 0,
  /// Updates operands in place (the executor and kernel-check treat them as
  /// read-write).
  kInPlace = 1u << 0,
  /// An optimizer step: reads fp32 parameter masters, never bf16 shadows.
  kOptimizer = 1u << 1,
  /// Accumulates into a parameter's Grad buffer: the values it consumes
  /// are gradient contributions and stay fp32 like that buffer.
  kGradSink = 1u << 2,
  /// May make its output a view of its input (attr alias=1): both must be
  /// stored alike.
  kMayAlias = 1u << 3,
  /// Run by the executor itself, not by a backend (trace marks).
  kExecutor = 1u << 4,
  /// No op of the dialect lowers to it: the runtime derives it (KV-cache
  /// programs) or plans are written by hand.
  kRuntimeOnly = 1u << 5,
};

/// Which backends implement a kernel, as written in KernelVocab.def.
struct KernelInfo {
  std::string_view name;
  unsigned props;
  bool onCpu, onCuda;
  /// Why a backend lacks it; empty when both have it.
  std::string_view unsupportedWhy;
  constexpr bool has(KernelProp p) const { return (props & p) != 0; }
};

namespace detail {
constexpr bool vocabFlag(char c) { return c == 'Y'; }
} // namespace detail

inline constexpr KernelInfo kKernelVocab[] = {
#define MAPP_KERNEL(name, minIn, maxIn, minOut, maxOut, check, props, onCpu,    \
                    onCuda, why)                                                 \
  {#name, props, detail::vocabFlag(#onCpu[0]), detail::vocabFlag(#onCuda[0]), why},
#include "mapp/rt/KernelVocab.def"
#undef MAPP_KERNEL
};

inline constexpr size_t kKernelVocabSize =
    sizeof(kKernelVocab) / sizeof(kKernelVocab[0]);

/// The entry named `name`, or null: not a kernel any plan may use.
constexpr const KernelInfo *findKernelInfo(std::string_view name) {
  for (const KernelInfo &k : kKernelVocab)
    if (k.name == name)
      return &k;
  return nullptr;
}

namespace detail {
template <bool Known> constexpr std::string_view checkedKernelName(std::string_view n) {
  static_assert(Known, "not a kernel of KernelVocab.def");
  return n;
}
} // namespace detail

} // namespace mapp::rt

/// A kernel name as a std::string_view, checked against the vocabulary at
/// compile time: code that compares instructions' kernels with a literal
/// names them with this, so a renamed or removed row breaks the build.
#define MAPP_KERNEL_NAME(name)                                                 \
  (::mapp::rt::detail::checkedKernelName<::mapp::rt::findKernelInfo(#name) !=  \
                                         nullptr>(#name))

/// Expands to its arguments when `flag` is Y (a backend's column of the
/// vocabulary), to nothing when N: the backends register and declare their
/// kernels with it.
#define MAPP_VOCAB_IF(flag, ...) MAPP_VOCAB_IF_##flag(__VA_ARGS__)
#define MAPP_VOCAB_IF_Y(...) __VA_ARGS__
#define MAPP_VOCAB_IF_N(...)

#endif

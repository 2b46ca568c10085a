//===- Kernels.h - kernel signatures and calling convention -----*- C++ -*-===//
//
// The backend-independent part of docs/semantics.md: which kernels exist, how
// many operands each takes, and the shape/dtype rules the loader enforces
// before anything runs. Backends implement KernelFn for each name.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_KERNELS_H
#define MAPP_RT_KERNELS_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Tensor.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace mapp::rt {

class ThreadPool;
class Communicator;
class Backend;
class ProbeRuntime;

/// Per-call state that is not an operand: the optimizer step (dropout masks,
/// bias correction, lr schedule), the clipping inputs and the workers.
/// What a variable all-to-all kernel (ep_dispatch / ep_combine) moved, per
/// member of its group, for the MegaScan record (docs/trace-format.md
/// send_bytes / recv_bytes): an unbalanced expert shows as one large entry.
struct PeerBytes {
  std::vector<uint64_t> send, recv;
};

struct KernelContext {
  int64_t step = 0; // 0-based training step
  int microbatch = 0;
  /// Plan num_microbatches: send/recv use tag * numMicrobatches + microbatch.
  int numMicrobatches = 1;
  /// Global gradient norm of this step, computed by the executor before the
  /// optimizer block; used for clipping when the instr has no norm operand.
  double gradNorm = std::numeric_limits<double>::quiet_NaN();
  /// Plan-level max_grad_norm; an instr's `max_norm` attr overrides it.
  double maxGradNorm = 0;
  /// Loss scaling (--mapp-mixed-precision): a `fill` with attr loss_scale
  /// multiplies its value by this; an optimizer instr with it divides the
  /// gradients (and a norm operand) by it. 1 without loss scaling.
  double lossScale = 1;
  ThreadPool *pool = nullptr;
  Communicator *comm = nullptr;
  /// The backend running the kernel (device backends keep handles, streams
  /// and scratch there); null in contexts built by hand for CPU kernels.
  Backend *backend = nullptr;
  /// MegaScope sink and switches (mapp/rt/Probe.h); null = probes off.
  ProbeRuntime *probe = nullptr;
  /// Set by the executor around a traced variable all-to-all; the kernel
  /// fills it (null: nobody asks).
  PeerBytes *peerBytes = nullptr;
  /// The adaptive scheduler posts every receive into a host buffer: send
  /// and recv then move plan-type bytes through the host communicator (a
  /// device backend stages them) so both ends speak the same protocol,
  /// unless the device communicator sends letters (DeviceComm::letterBytes),
  /// which a posted receive takes as well.
  bool p2pThroughHost = false;
};

struct KernelArgs {
  const Attrs &attrs;
  Tensor *in;
  int numIn;
  Tensor *out;
  int numOut;
  KernelContext &ctx;
};

using KernelFn = void (*)(const KernelArgs &);
using KernelCheckFn = void (*)(const Attrs &, const std::vector<TensorType> &in,
                               const std::vector<TensorType> &out);

/// What a kernel name means independent of the backend: a row of
/// KernelVocab.def (the one list of kernels).
struct KernelSpec {
  const char *name;
  int minIn, maxIn; // maxIn = -1: unbounded (concat, global_norm)
  int minOut, maxOut;
  /// Throws Error (without a location prefix) when shapes/dtypes/attrs do
  /// not fit docs/semantics.md.
  KernelCheckFn check;
  /// Operands the kernel updates in place (optimizers, grad_accumulate's
  /// output): the executor and kernel-check treat them as read-write.
  bool inPlace;
  /// KernelProp bits (mapp/rt/KernelVocab.h).
  unsigned props;
};

const KernelSpec *findKernelSpec(const std::string &name);
/// Kernels the executor runs itself, not a backend (trace_begin/trace_end).
bool isExecutorKernel(const std::string &name);
/// Every row of KernelVocab.def, in order.
const std::vector<KernelSpec> &allKernelSpecs();

/// Checks operand counts and calls the spec's check; messages are prefixed by
/// the caller with the instruction's location.
void checkKernelCall(const KernelSpec &spec, const Attrs &attrs,
                     const std::vector<TensorType> &in,
                     const std::vector<TensorType> &out);

/// Learning rate at 0-based step k from an optimizer instr's attrs:
/// lr, schedule = constant|cosine, warmup, total_steps, min_lr
/// (docs/semantics.md).
double scheduledLr(const Attrs &attrs, int64_t step);

/// splitmix64 as a pure function: the finalizer applied to x + golden ratio.
inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
/// Dropout's uniform u(s, k, n) in [0, 1) from docs/semantics.md.
inline float dropoutUniform(uint64_t seed, uint64_t step, uint64_t n) {
  uint64_t r = splitmix64(seed ^ splitmix64(step ^ splitmix64(n)));
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
}

} // namespace mapp::rt

#endif

//===- Probe.h - what probe and perturb kernels talk to ---------*- C++ -*-===//
//
// The "probe" kernel reduces its input (ProbeReduce.h) and hands the result
// to the ProbeRuntime set on the KernelContext; the "perturb" kernel reads its
// switch from it. Without a ProbeRuntime probes cost one branch and
// perturbations use their compiled settings. A backend that reduces on the
// device (CUDA) produces the same ProbeSample records and calls record().
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBE_H
#define MAPP_RT_PROBE_H

#include "mapp/rt/DType.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace mapp::rt {

/// One reduction of one probe at one step and microbatch.
struct ProbeSample {
  int64_t probeId = 0;
  int64_t step = 0;
  int microbatch = 0;
  std::string reduction;
  /// Scalar reductions (max, min, mean, std, absmax, sparsity).
  double value = std::numeric_limits<double>::quiet_NaN();
  /// Vector reductions: hist counts, topk values, sketch, raw, attn.
  std::vector<float> data;
  /// topk: flat element indices (within the selected tokens' elements).
  std::vector<int64_t> index;
  Shape shape; // of `data`
};

/// State of one perturbation switch as the kernels see it during a step.
struct SwitchState {
  bool enabled = true;
  double magnitude = 0;
};

class ProbeRuntime {
public:
  virtual ~ProbeRuntime() = default;
  /// Takes a finished sample; must not block for long (the step waits).
  virtual void record(ProbeSample &&s) = 0;
  /// The live state of switch `id`; false when the runtime has no override,
  /// so the kernel keeps its compiled `enabled`/`magnitude`.
  virtual bool switchState(int64_t id, SwitchState &out) const = 0;
  /// Generation records every forward (the step is the token index);
  /// training honours each probe's `every`.
  virtual bool generating() const { return false; }
};

} // namespace mapp::rt

#endif

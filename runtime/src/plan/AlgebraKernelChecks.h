//===- AlgebraKernelChecks.h - load-time checks of the algebra --*- C++ -*-===//
//
// Defined in AlgebraKernelSpecs.cpp, named by KernelVocab.def's tensor
// algebra rows (the ops of MappTensorOps.td).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PLAN_ALGEBRAKERNELCHECKS_H
#define MAPP_RT_PLAN_ALGEBRAKERNELCHECKS_H

#include "mapp/rt/Kernels.h"

namespace mapp::rt::algebra {

#define MAPP_DECLARE_CHECK(name)                                               \
  void name(const Attrs &, const std::vector<TensorType> &in,                  \
            const std::vector<TensorType> &out);
MAPP_DECLARE_CHECK(checkElementwise)
MAPP_DECLARE_CHECK(checkBroadcastTo)
MAPP_DECLARE_CHECK(checkConstant)
MAPP_DECLARE_CHECK(checkCast)
MAPP_DECLARE_CHECK(checkFused)
#undef MAPP_DECLARE_CHECK

/// The `value` floats of a constant instruction (empty when absent).
const std::vector<double> &constantValues(const Attrs &a);

} // namespace mapp::rt::algebra

#endif

//===- MoeKernelChecks.h - load-time checks of the MoE kernels --*- C++ -*-===//
//
// Defined in MoeKernelSpecs.cpp, named by KernelVocab.def's MoE rows.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PLAN_MOEKERNELCHECKS_H
#define MAPP_RT_PLAN_MOEKERNELCHECKS_H

#include "mapp/rt/Kernels.h"

namespace mapp::rt::moe {

#define MAPP_DECLARE_CHECK(name)                                               \
  void name(const Attrs &, const std::vector<TensorType> &in,                  \
            const std::vector<TensorType> &out);
MAPP_DECLARE_CHECK(checkRouter)
MAPP_DECLARE_CHECK(checkRouterGrad)
MAPP_DECLARE_CHECK(checkAssign)
MAPP_DECLARE_CHECK(checkPermute)
MAPP_DECLARE_CHECK(checkPermuteGrad)
MAPP_DECLARE_CHECK(checkUnpermute)
MAPP_DECLARE_CHECK(checkUnpermuteGrad)
MAPP_DECLARE_CHECK(checkGrouped)
MAPP_DECLARE_CHECK(checkGroupedWgrad)
MAPP_DECLARE_CHECK(checkAux)
MAPP_DECLARE_CHECK(checkZ)
#undef MAPP_DECLARE_CHECK

} // namespace mapp::rt::moe

#endif

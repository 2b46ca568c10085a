//===- PlanMutate.h - plan mutations of mapp-fuzz-plan ----------*- C++ -*-===//
#ifndef MAPP_FUZZ_PLANMUTATE_H
#define MAPP_FUZZ_PLANMUTATE_H

#include "FuzzCommon.h"

#include "mapp/rt/Plan.h"

namespace mappfuzz {
/// Applies one to a few random structured edits to `plan` (plan_mutate.cpp).
void mutatePlan(Rng &r, mapp::rt::Plan &plan);
} // namespace mappfuzz

#endif

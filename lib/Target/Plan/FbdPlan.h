//===- FbdPlan.h - MegaFBD programs of a split module -----------*- C++ -*-===//
//
// Private to the plan target: the per-rank builder shared with PlanBuilder,
// and the step that adds a split module's forward-side programs.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TARGET_PLAN_FBDPLAN_H
#define MAPP_TARGET_PLAN_FBDPLAN_H

#include "mapp/Analysis/MemoryPlan.h"
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Target/Plan/plan_generated.h"

namespace mapp {

/// One rank's Program of `stage` (mem.stage); prog's rank/dp/pp/tp set.
mlir::LogicalResult buildStageProgram(mlir::ModuleOp module,
                                      const StepStructure &step,
                                      const StageMemory &mem,
                                      plan::ProgramT &prog);

/// A module with `mapp.fbd` (--mapp-split-fwd-bwd): `plan` holds the
/// backward side's programs; adds the forward side's (ranks after them),
/// resolves the forward↔backward transfers and sets every Placement.
mlir::LogicalResult addFbdPrograms(mlir::ModuleOp module, plan::PlanT &plan,
                                   bool aliasReshapes);

} // namespace mapp

#endif

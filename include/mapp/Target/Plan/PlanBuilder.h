//===- PlanBuilder.h - training IR to per-rank plan programs ----*- C++ -*-===//
//
// Builds the plan (runtime/schema/plan.fbs, object API) from a module that
// follows docs/plan-lowering.md, and serializes it. The runtime never sees
// MLIR: this is the only place the two meet.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TARGET_PLAN_PLANBUILDER_H
#define MAPP_TARGET_PLAN_PLANBUILDER_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>

namespace mapp {
namespace plan {
struct PlanT;
} // namespace plan

/// One Program per global rank; fails with located diagnostics.
/// `aliasReshapes`: see planStageMemory.
mlir::FailureOr<std::unique_ptr<plan::PlanT>>
buildPlan(mlir::ModuleOp module, bool aliasReshapes = true);

/// Serializes with the "MPLN" file identifier, followed by the PlanSeal
/// (plan.fbs: schema version, body size, CRC-32) the runtime checks.
mlir::LogicalResult writePlan(mlir::ModuleOp module, llvm::raw_ostream &os,
                              bool aliasReshapes = true);

void registerToPlanTranslation();

} // namespace mapp

#endif

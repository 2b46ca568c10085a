#ifndef MAPP_TRANSFORMS_PASSES_H
#define MAPP_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"

namespace mapp {
#define GEN_PASS_DECL
#include "mapp/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "mapp/Transforms/Passes.h.inc"

/// Registers the named pass pipelines (--mapp-train-pipeline).
void registerMappPipelines();
} // namespace mapp

#endif

// --mapp-lower-to-plan: build the per-rank programs and record a summary.
#include "mapp/Target/Plan/PlanBuilder.h"
#include "mapp/Target/Plan/plan_generated.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/IR/Builders.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPLOWERTOPLAN
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {
struct LowerToPlanPass : mapp::impl::MappLowerToPlanBase<LowerToPlanPass> {
  using Base::Base;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<std::unique_ptr<plan::PlanT>> p = buildPlan(module);
    if (failed(p))
      return signalPassFailure();
    Builder b(&getContext());
    SmallVector<int64_t> instrs;
    for (auto &prog : (*p)->programs) {
      int64_t n = 0;
      for (auto &block : prog->blocks)
        n += block->instrs.size();
      instrs.push_back(n);
    }
    module->setAttr(
        "mapp.plan",
        b.getDictionaryAttr(
            {b.getNamedAttr("world_size",
                            b.getI64IntegerAttr((*p)->world_size)),
             b.getNamedAttr("instructions", b.getDenseI64ArrayAttr(instrs))}));
  }
};
} // namespace

// --mapp-plan-memory: report (and record) each stage's memory plan.
#include "mapp/Analysis/MemoryPlan.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/Format.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPPLANMEMORY
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {
std::string mib(uint64_t bytes) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.2f MiB", bytes / 1048576.0);
  return s;
}

struct PlanMemoryPass : mapp::impl::MappPlanMemoryBase<PlanMemoryPass> {
  using Base::Base;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!activationStorage.empty()) {
      if (activationStorage != "f32" && activationStorage != "bf16") {
        module.emitError("mapp-plan-memory: activation-storage must be f32 or "
                         "bf16, got '")
            << activationStorage << "'";
        return signalPassFailure();
      }
      module->setAttr(kActivationStorageAttr,
                      StringAttr::get(&getContext(), activationStorage));
    }
    FailureOr<StepStructure> step = StepStructure::analyze(module);
    if (failed(step))
      return signalPassFailure();
    // --mapp-recompute's rewrite (all stages): what left the stashes.
    if (auto rc = module->getAttrOfType<DictionaryAttr>("mapp.recompute"); rc) {
      auto get = [&](StringRef k) {
        auto a = rc.getAs<IntegerAttr>(k);
        return a ? a.getInt() : 0;
      };
      auto str = [&](StringRef k) {
        auto a = rc.getAs<StringAttr>(k);
        return a ? a.getValue() : StringRef("?");
      };
      emitRemark(module.getLoc())
          << "recompute " << str("policy") << " (layers " << str("layers")
          << "): " << get("dropped") << " saved values ("
          << get("dropped_bytes") << " B) recomputed in the backward, "
          << get("added") << " boundary values (" << get("added_bytes")
          << " B) saved instead";
    }
    Builder b(&getContext());
    SmallVector<Attribute> stages;
    for (int64_t s = 0; s < step->layout.pp; ++s) {
      FailureOr<StageMemory> mem = planStageMemory(module, *step, s);
      if (failed(mem) || failed(applyMemCap(module, step->layout, *mem)))
        return signalPassFailure();
      // Per schedule table: the activations it stashes at its peak.
      std::string stash;
      llvm::raw_string_ostream os(stash);
      os << "; stash " << mem->stashBytes << " B per (chunk, microbatch)";
      for (auto &[kind, n] : mem->stashPeaks)
        os << "; " << kind << ": " << n << " in flight, "
           << n * mem->stashBytes << " B stashed";
      emitRemark(module.getLoc()) << "memory plan, stage " << s << ": peak "
                          << mem->peakBytes() << " B (" << mib(mem->peakBytes())
                          << ") = persistent " << mem->persistentBytes
                          << " B + " << mem->slots << " slot(s) x arena "
                          << mem->arenaBytes << " B (" << mem->naiveArenaBytes
                          << " B without reuse); reshapes: "
                          << mem->aliasOf.size() << " aliased, "
                          << mem->copiedReshapes << " copied; "
                          << mem->bf16.size() << " values stored bf16"
                          << stash;
      stages.push_back(b.getDictionaryAttr({
          b.getNamedAttr("stage", b.getI64IntegerAttr(s)),
          b.getNamedAttr("arena_bytes", b.getI64IntegerAttr(mem->arenaBytes)),
          b.getNamedAttr("persistent_bytes",
                         b.getI64IntegerAttr(mem->persistentBytes)),
          b.getNamedAttr("slots", b.getI64IntegerAttr(mem->slots)),
          b.getNamedAttr("peak_bytes", b.getI64IntegerAttr(mem->peakBytes())),
          b.getNamedAttr("stash_bytes", b.getI64IntegerAttr(mem->stashBytes)),
      }));
    }
    module->setAttr("mapp.memory", b.getArrayAttr(stages));
  }
};
} // namespace

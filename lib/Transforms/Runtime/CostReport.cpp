// --mapp-cost-report: FLOPs and bytes per plan block and per layer.
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/Format.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPCOSTREPORT
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct Cost {
  uint64_t flops = 0, read = 0, written = 0;
  void add(CostOpInterface op) {
    flops += op.getFlops();
    read += op.getBytesRead();
    written += op.getBytesWritten();
  }
};

/// The block's path ("layers.N", "transformer.h.N") from an op's name, or
/// "" outside the transformer layers.
std::string layerKey(Operation *op, const LayerNames &names) {
  std::optional<unsigned> layer = names.layerOf(op);
  return layer ? names.key(*layer) : "";
}

std::string ratio(uint64_t num, uint64_t den) {
  std::string s;
  llvm::raw_string_ostream os(s);
  if (den == 0)
    os << "n/a";
  else
    os << llvm::format("%.3f", (double)num / den);
  return s;
}

StringRef phaseName(Phase p) {
  switch (p) {
  case Phase::Forward:
    return "forward";
  case Phase::Optimizer:
    return "optimizer";
  default:
    return "backward";
  }
}

struct CostReportPass : mapp::impl::MappCostReportBase<CostReportPass> {
  using Base::Base;
  void runOnOperation() override {
    ModuleOp module = getOperation();
    FailureOr<StepStructure> step = StepStructure::analyze(module);
    if (failed(step))
      return signalPassFailure();
    llvm::MapVector<StringRef, Cost> byPhase;
    const LayerNames names = LayerNames::of(module);
    llvm::StringSet<> layerKeys; // byLayer's keys point into it
    llvm::MapVector<StringRef, std::pair<Cost, Cost>> byLayer; // fwd, bwd
    for (const StepBlock &b : step->blocks) {
      StringRef phase = phaseName(b.phase);
      b.func.walk([&](CostOpInterface op) {
        byPhase[phase].add(op);
        std::string layer = layerKey(op, names);
        if (layer.empty() || b.phase == Phase::Optimizer)
          return;
        auto &[fwd, bwd] = byLayer[layerKeys.insert(layer).first->getKey()];
        (b.phase == Phase::Forward ? fwd : bwd).add(op);
      });
    }
    Location loc = module.getLoc();
    for (auto &[phase, c] : byPhase)
      emitRemark(loc) << "cost: " << phase << " " << c.flops << " FLOPs, "
                      << c.read << " B read, " << c.written << " B written";
    emitRemark(loc) << "cost: backward/forward FLOPs "
                    << ratio(byPhase.lookup("backward").flops,
                             byPhase.lookup("forward").flops);
    for (auto &[layer, c] : byLayer)
      emitRemark(loc) << "cost: " << layer << " forward " << c.first.flops
                      << " backward " << c.second.flops
                      << " FLOPs, backward/forward "
                      << ratio(c.second.flops, c.first.flops);
  }
};

} // namespace

// --mapp-cost-report: FLOPs and bytes per plan block and per layer.
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "llvm/ADT/MapVector.h"
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

/// "layers.N" from an op's name, or "" outside the transformer layers (the
/// StringRef points into the uniqued attribute, so it outlives the walk).
StringRef layerKey(Operation *op) {
  auto n = op->getAttrOfType<StringAttr>("mapp.name");
  if (!n || !n.getValue().starts_with("layers."))
    return "";
  StringRef s = n.getValue();
  return s.substr(0, s.find('.', 7));
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
    llvm::MapVector<StringRef, std::pair<Cost, Cost>> byLayer; // fwd, bwd
    for (const StepBlock &b : step->blocks) {
      StringRef phase = phaseName(b.phase);
      b.func.walk([&](CostOpInterface op) {
        byPhase[phase].add(op);
        StringRef layer = layerKey(op);
        if (layer.empty() || b.phase == Phase::Optimizer)
          return;
        auto &[fwd, bwd] = byLayer[layer];
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

// --mapp-verify-schedule: runs the schedule verifier on every mapp.schedule
// op and optionally reports what the simulation measured.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/Transforms/Schedules.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/Support/Format.h"

#include <map>

namespace mapp {
#define GEN_PASS_DEF_MAPPVERIFYSCHEDULE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct VerifySchedulePass
    : mapp::impl::MappVerifyScheduleBase<VerifySchedulePass> {
  using Base::Base;

  /// Every mapp.send of a pipeline stage function has exactly one mapp.recv
  /// on its peer stage with the same tag and type, and vice versa.
  LogicalResult checkTransfers(ModuleOp module) {
    struct End {
      Operation *op;
      Type type;
    };
    // (from stage, to stage, tag) → the sends / recvs.
    std::map<std::tuple<int64_t, int64_t, int64_t>, SmallVector<End>> sends,
        recvs;
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto stageAttr = fn->getAttrOfType<IntegerAttr>("mapp.stage");
      if (!stageAttr)
        continue;
      int64_t stage = stageAttr.getInt();
      fn.walk([&](SendOp op) {
        sends[{stage, op.getPeerAttr().getInt(), op.getTagAttr().getInt()}]
            .push_back({op, op.getX().getType()});
      });
      fn.walk([&](RecvOp op) {
        recvs[{op.getPeerAttr().getInt(), stage, op.getTagAttr().getInt()}]
            .push_back({op, op.getType()});
      });
    }
    auto describe = [](const std::tuple<int64_t, int64_t, int64_t> &k) {
      return "from stage " + std::to_string(std::get<0>(k)) + " to stage " +
             std::to_string(std::get<1>(k)) + " with tag " +
             std::to_string(std::get<2>(k));
    };
    for (auto &[key, ends] : sends) {
      auto it = recvs.find(key);
      if (ends.size() > 1)
        return ends[1].op->emitError("mapp-verify-schedule: second send ")
               << describe(key);
      if (it == recvs.end())
        return ends[0].op->emitError("mapp-verify-schedule: send ")
               << describe(key) << " has no matching recv on stage "
               << std::get<1>(key);
      if (it->second.size() > 1)
        return it->second[1].op->emitError("mapp-verify-schedule: second recv ")
               << describe(key);
      if (it->second[0].type != ends[0].type)
        return it->second[0].op->emitError("mapp-verify-schedule: recv ")
               << describe(key) << " expects " << it->second[0].type
               << " but the send carries " << ends[0].type;
    }
    for (auto &[key, ends] : recvs)
      if (!sends.count(key))
        return ends[0].op->emitError("mapp-verify-schedule: recv ")
               << describe(key) << " has no matching send on stage "
               << std::get<0>(key);
    return success();
  }

  /// Per-chunk task costs from the IR's cost model: the mean FLOPs of the
  /// module's forward, backward, backward-input and backward-weight
  /// functions (CostOpInterface), relative to the forward's.
  LogicalResult costsFromIR(ModuleOp module, sched::Costs &costs) {
    std::map<std::string, std::pair<double, int>> flops; // kind → sum, count
    for (auto fn : module.getOps<func::FuncOp>()) {
      auto phase = fn->getAttrOfType<StringAttr>("mapp.phase");
      if (!phase || phase.getValue() == "optimizer")
        continue;
      std::string kind = phase.str();
      if (auto split = fn->getAttrOfType<StringAttr>("mapp.split"))
        kind += "." + split.str();
      double f = 0;
      fn.walk([&](CostOpInterface op) { f += op.getFlops(); });
      flops[kind].first += f;
      flops[kind].second += 1;
    }
    auto mean = [&](const char *k) {
      auto it = flops.find(k);
      return it == flops.end() ? 0.0 : it->second.first / it->second.second;
    };
    double f = mean("forward");
    if (f <= 0)
      return module.emitError("mapp-verify-schedule: cost-model=true needs "
                              "forward functions with FLOPs (run "
                              "--mapp-autodiff first)");
    costs.forward = 1;
    costs.backward = mean("backward") / f;
    costs.backwardInput = mean("backward.input") / f;
    costs.backwardWeight = mean("backward.weight") / f;
    // An unsplit step's B stands for Bi + W (half each) and vice versa.
    if (costs.backward == 0)
      costs.backward = costs.backwardInput + costs.backwardWeight;
    if (costs.backwardInput == 0 && costs.backwardWeight == 0)
      costs.backwardInput = costs.backwardWeight = costs.backward / 2;
    return success();
  }

  void runOnOperation() override {
    if (failed(checkTransfers(getOperation())))
      return signalPassFailure();
    sched::Costs costs;
    costs.forward = forwardCost;
    costs.backward = backwardCost;
    costs.backwardInput = backwardInputCost;
    costs.backwardWeight = backwardWeightCost;
    if (costModel && failed(costsFromIR(getOperation(), costs)))
      return signalPassFailure();
    bool failed = false;
    getOperation().walk([&](ScheduleOp op) {
      sched::Schedule s = sched::fromOp(op);
      sched::Stats stats;
      std::string error;
      if (!sched::verify(s, costs, stats, error)) {
        op.emitError("mapp-verify-schedule: ") << error;
        failed = true;
        return;
      }
      if (!report)
        return;
      std::string text;
      llvm::raw_string_ostream os(text);
      if (costModel)
        os << "costs from the IR (per chunk, F = 1): B "
           << llvm::format("%.3f", costs.backward) << ", Bi "
           << llvm::format("%.3f", costs.backwardInput) << ", W "
           << llvm::format("%.3f", costs.backwardWeight) << "; ";
      os << "schedule " << s.kind << ": " << s.stages << " stage(s) x "
         << s.chunks << " chunk(s), " << s.microbatches
         << " microbatch(es): makespan " << llvm::format("%g", stats.makespan)
         << ", bubble " << llvm::format("%.4f", stats.bubble);
      for (int64_t r = 0; r < s.stages; ++r)
        os << "; rank " << r << ": F before first B " << stats.warmupForwards[r]
           << ", peak in flight " << stats.peakInFlight[r] << ", bubble "
           << llvm::format("%.4f", stats.rankBubble[r]);
      emitRemark(op.getLoc(), text);
    });
    if (failed)
      signalPassFailure();
  }
};

} // namespace

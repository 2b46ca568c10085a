// --mapp-verify-schedule: runs the schedule verifier on every mapp.schedule
// op and optionally reports what the simulation measured.
#include "mapp/Transforms/Passes.h"
#include "mapp/Transforms/Schedules.h"

#include "llvm/Support/Format.h"

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

  void runOnOperation() override {
    sched::Costs costs;
    costs.forward = forwardCost;
    costs.backward = backwardCost;
    costs.backwardInput = backwardInputCost;
    costs.backwardWeight = backwardWeightCost;
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
      os << "schedule " << s.kind << ": " << s.stages << " stage(s) x "
         << s.chunks << " chunk(s), " << s.microbatches
         << " microbatch(es): makespan " << llvm::format("%g", stats.makespan)
         << ", bubble " << llvm::format("%.4f", stats.bubble);
      for (int64_t r = 0; r < s.stages; ++r)
        os << "; rank " << r << ": F before first B " << stats.warmupForwards[r]
           << ", peak in flight " << stats.peakInFlight[r];
      op.emitRemark(text);
    });
    if (failed)
      signalPassFailure();
  }
};

} // namespace

// --mapp-pipeline-schedule: the step's task tables as a `mapp.schedule` op.
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/Transforms/Schedules.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPPIPELINESCHEDULE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct PipelineSchedulePass
    : mapp::impl::MappPipelineScheduleBase<PipelineSchedulePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The partition's degrees (mapp.parallel) are the default; options that
    // contradict them are an error.
    int64_t p = pp > 0 ? (int64_t)pp : getParallelInt(module, "pp", 1);
    int64_t v = chunks > 0 ? (int64_t)chunks
                           : getParallelInt(module, "chunks", 1);
    if ((hasParallelKey(module, "pp") && getParallelInt(module, "pp", 1) != p) ||
        (hasParallelKey(module, "chunks") &&
         getParallelInt(module, "chunks", 1) != v)) {
      module.emitError("mapp-pipeline-schedule: pp=")
          << p << " chunks=" << v << " disagree with the partition (pp="
          << getParallelInt(module, "pp", 1)
          << ", chunks=" << getParallelInt(module, "chunks", 1) << ")";
      return signalPassFailure();
    }
    std::string kind = schedule;
    // One chunk per stage makes "interleaved" plain 1F1B; accept it.
    if (kind == "interleaved" && v == 1)
      kind = "1f1b";
    sched::Schedule s;
    std::string error;
    if (!sched::generate(kind, p, v, microbatches, s, error)) {
      module.emitError("mapp-pipeline-schedule: ") << error;
      return signalPassFailure();
    }
    // Generated tables are checked like hand-written ones.
    sched::Stats stats;
    if (!sched::verify(s, sched::Costs(), stats, error)) {
      module.emitError("mapp-pipeline-schedule: generated an invalid "
                       "schedule (a bug): ")
          << error;
      return signalPassFailure();
    }
    for (auto old : llvm::make_early_inc_range(module.getOps<ScheduleOp>()))
      old.erase();
    OpBuilder b(module.getBody(), module.getBody()->end());
    sched::toOp(b, module.getLoc(), s);
    setParallelInt(module, "microbatches", microbatches);
    setParallelAttr(module, "schedule", b.getStringAttr(kind));
  }
};

} // namespace

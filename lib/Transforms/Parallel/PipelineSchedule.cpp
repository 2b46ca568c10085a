// --mapp-pipeline-schedule: the step's task tables as `mapp.schedule` ops
// (one; two for schedule=adaptive: "dfc" then "bfc").
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/Transforms/Schedules.h"

#include "llvm/ADT/StringExtras.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPPIPELINESCHEDULE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

/// Bytes from "123", "512K", "64MiB", "2G" (binary units); nullopt if
/// malformed.
static std::optional<uint64_t> parseBytes(StringRef s) {
  s = s.trim();
  if (s.empty())
    return 0;
  uint64_t n;
  StringRef digits = s.take_while([](char c) { return llvm::isDigit(c); });
  if (digits.empty() || digits.getAsInteger(10, n))
    return std::nullopt;
  StringRef unit = s.drop_front(digits.size()).trim();
  unit.consume_back("iB") || unit.consume_back("B");
  uint64_t scale = unit.empty()           ? 1
                   : unit.equals_insensitive("k") ? 1ull << 10
                   : unit.equals_insensitive("m") ? 1ull << 20
                   : unit.equals_insensitive("g") ? 1ull << 30
                                                  : 0;
  if (!scale || (n && scale > UINT64_MAX / n))
    return std::nullopt;
  return n * scale;
}

namespace {

struct PipelineSchedulePass
    : mapp::impl::MappPipelineScheduleBase<PipelineSchedulePass> {
  using Base::Base;

  /// The adaptive policy's module attribute; failure (diagnosed) on a bad
  /// option.
  FailureOr<DictionaryAttr> adaptivePolicy(ModuleOp module) {
    auto bad = [&](const Twine &msg) {
      module.emitError("mapp-pipeline-schedule: ") << msg;
      return failure();
    };
    std::optional<uint64_t> cap = parseBytes(memCap);
    if (!cap)
      return bad("mem-cap='" + memCap +
                 "' is not a byte count (e.g. 1073741824, 512MiB, 2G)");
    if (!(slowLinkRatio > 1.0))
      return bad("slow-link-ratio must be > 1 (a link is slow when its "
                 "bandwidth is this many times below its best), got " +
                 std::to_string(slowLinkRatio));
    if (!(bandwidthSmoothing > 0.0 && bandwidthSmoothing <= 1.0))
      return bad("bandwidth-smoothing must be in (0, 1], got " +
                 std::to_string(bandwidthSmoothing));
    Builder b(module.getContext());
    return b.getDictionaryAttr({
        b.getNamedAttr("mem_cap_bytes", b.getI64IntegerAttr(*cap)),
        b.getNamedAttr("slow_link_ratio", b.getF64FloatAttr(slowLinkRatio)),
        b.getNamedAttr("bandwidth_smoothing",
                       b.getF64FloatAttr(bandwidthSmoothing)),
    });
  }

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
    bool adaptive = kind == "adaptive";
    if (!adaptive && (!memCap.empty() && memCap != "0")) {
      module.emitError("mapp-pipeline-schedule: mem-cap applies to "
                       "schedule=adaptive, not '")
          << kind << "'";
      return signalPassFailure();
    }
    // One chunk per stage makes "interleaved" plain 1F1B; accept it.
    if (kind == "interleaved" && v == 1 && group == 0)
      kind = "1f1b";
    SmallVector<sched::Schedule, 2> tables(adaptive ? 2 : 1);
    std::string error;
    bool ok;
    if (adaptive && group != 0) {
      error = "group= does not apply to schedule=adaptive (its tables are "
              "dfc and bfc)";
      ok = false;
    } else if (adaptive) {
      ok = sched::generateAdaptive(p, v, microbatches, tables[0], tables[1],
                                   error);
    } else {
      ok = sched::generate(kind, p, v, microbatches, tables[0], error, group);
    }
    if (!ok) {
      module.emitError("mapp-pipeline-schedule: ") << error;
      return signalPassFailure();
    }
    // Generated tables are checked like hand-written ones.
    for (const sched::Schedule &s : tables) {
      sched::Stats stats;
      if (!sched::verify(s, sched::Costs(), stats, error)) {
        module.emitError("mapp-pipeline-schedule: generated an invalid "
                         "schedule (a bug): ")
            << error;
        return signalPassFailure();
      }
    }
    FailureOr<DictionaryAttr> policy;
    if (adaptive && failed(policy = adaptivePolicy(module)))
      return signalPassFailure();
    for (auto old : llvm::make_early_inc_range(module.getOps<ScheduleOp>()))
      old.erase();
    OpBuilder b(module.getBody(), module.getBody()->end());
    for (const sched::Schedule &s : tables)
      sched::toOp(b, module.getLoc(), s);
    setParallelInt(module, "microbatches", microbatches);
    setParallelAttr(module, "schedule", b.getStringAttr(kind));
    if (adaptive)
      module->setAttr(kAdaptiveAttr, *policy);
    else
      module->removeAttr(kAdaptiveAttr);
  }
};

} // namespace

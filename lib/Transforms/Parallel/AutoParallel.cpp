// --mapp-auto-parallel: choose the layout with the cost model that mapp-sim
// shares (runtime/src/cost), then compile it as --mapp-train-pipeline and
// hold it to the memory planner's figure (docs/auto-parallel.md).
#include "ModelDims.h"
#include "mapp/Analysis/MemoryPlan.h"
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Frontend/GPT/GPTImporter.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/cost/Search.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/JSON.h"

#include <optional>

namespace mapp {
#define GEN_PASS_DEF_MAPPAUTOPARALLEL
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;
namespace cost = mapp::cost;

namespace {

/// How far over the cap the formula may put a layout that the memory
/// planner then checks (SearchRequest::capSlack).
constexpr double kPlannerCheckedSlack = 0.15;

int64_t intKey(DictionaryAttr d, StringRef k, int64_t dflt = 0) {
  auto a = d.getAs<IntegerAttr>(k);
  return a ? a.getInt() : dflt;
}

/// mapp.model back into a config (the importer's canonical keys).
std::string configJson(DictionaryAttr d, int64_t microBatch) {
  llvm::json::Object o;
  for (NamedAttribute a : d) {
    std::string k = a.getName().str();
    if (k == "kind")
      k = "variant";
    if (auto s = dyn_cast<StringAttr>(a.getValue()))
      o[k] = s.getValue().str();
    else if (auto b = dyn_cast<BoolAttr>(a.getValue()))
      o[k] = b.getValue();
    else if (auto i = dyn_cast<IntegerAttr>(a.getValue()))
      o[k] = i.getInt();
    else if (auto f = dyn_cast<FloatAttr>(a.getValue()))
      o[k] = f.getValueAsDouble();
    else if (auto arr = dyn_cast<DenseI64ArrayAttr>(a.getValue())) {
      llvm::json::Array v;
      for (int64_t x : arr.asArrayRef())
        v.push_back(x);
      o[k] = std::move(v);
    }
  }
  o["micro_batch_size"] = microBatch;
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::json::Value(std::move(o));
  return s;
}

/// Replaces `module`'s body and attributes with `from`'s.
void replaceModule(ModuleOp module, ModuleOp from) {
  module.getBody()->clear();
  IRMapping map;
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  for (Operation &op : from.getBody()->getOperations())
    b.clone(op, map);
  module->setAttrs(from->getAttrDictionary());
}

std::vector<std::string> splitList(StringRef s) {
  SmallVector<StringRef> parts;
  s.split(parts, ',', -1, false);
  std::vector<std::string> out;
  for (StringRef p : parts)
    out.push_back(p.trim().str());
  return out;
}

std::string gib(double bytes) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.3f GiB", bytes / 1073741824.0);
  return s;
}

struct AutoParallelPass
    : mapp::impl::MappAutoParallelBase<AutoParallelPass> {
  using Base::Base;

  LogicalResult fail(ModuleOp module, const Twine &msg) {
    module.emitError("mapp-auto-parallel: ") << msg;
    return failure();
  }

  LogicalResult space(ModuleOp module, cost::SearchSpace &sp) {
    if (!schedules.empty()) {
      sp.schedules = splitList(schedules);
      for (const std::string &s : sp.schedules)
        if (!llvm::is_contained(std::vector<std::string>{"1f1b", "interleaved",
                                                         "zb-h1", "dfc", "bfc",
                                                         "adaptive", "gpipe"},
                                s))
          return fail(module, "schedules: unknown schedule '" + s +
                                  "' (expected 1f1b, interleaved, zb-h1, dfc, "
                                  "bfc, adaptive, gpipe)");
    }
    if (!recomputes.empty()) {
      sp.recomputes.clear();
      for (const std::string &r : splitList(recomputes)) {
        if (r == "none")
          sp.recomputes.push_back(cost::Recompute::None);
        else if (r == "selective")
          sp.recomputes.push_back(cost::Recompute::Selective);
        else if (r == "full")
          sp.recomputes.push_back(cost::Recompute::Full);
        else
          return fail(module, "recompute: unknown policy '" + r +
                                  "' (expected none, selective, full)");
      }
    }
    auto ints = [&](StringRef text, StringRef key,
                    std::vector<int> &out) -> LogicalResult {
      if (text.empty())
        return success();
      out.clear();
      for (const std::string &x : splitList(text)) {
        int v = 0;
        if (StringRef(x).getAsInteger(10, v) || v < 1)
          return fail(module, key + ": expected positive integers, got '" + x +
                                  "'");
        out.push_back(v);
      }
      return success();
    };
    if (failed(ints(microBatches, "micro-batches", sp.microBatches)) ||
        failed(ints(chunkChoices, "chunks", sp.chunks)))
      return failure();
    sp.zero1 = zero1;
    if (!storages.empty())
      for (const std::string &s : splitList(storages)) {
        if (s == "f32")
          sp.storages.push_back(cost::DType::F32);
        else if (s == "bf16")
          sp.storages.push_back(cost::DType::BF16);
        else
          return fail(module, "activation-storage: expected f32 or bf16, got '" +
                                  s + "'");
      }
    return success();
  }

  /// The ranking as JSON; `checked` (compiling runs) adds the planner's
  /// verdict on each candidate compiled and the chosen one's rank.
  LogicalResult writeReport(ModuleOp module, const cost::SearchRequest &req,
                            const cost::SearchResult &res,
                            llvm::json::Object checked = {}) {
    llvm::json::Array rows;
    for (const cost::Ranked &r : res.top)
      rows.push_back(llvm::json::Object{
          {"layout", r.layout.brief()},
          {"options", r.layout.pipelineOptions()},
          {"micro_batch", r.layout.microBatch},
          {"activation_storage", cost::dtypeName(r.layout.storage)},
          {"tp", r.layout.tp},
          {"pp", r.layout.pp},
          {"dp", r.layout.dp},
          {"step_ms", r.pred.stepMs},
          {"tokens_per_s", r.pred.tokensPerS},
          {"peak_bytes", r.pred.peakBytes},
          {"outside_plan_bytes", r.pred.outsidePlanBytes},
          {"over_cap_predicted", r.overCapPredicted},
          {"bubble", r.pred.bubbleFraction},
          {"exposed_comm_ms", r.pred.exposedCommMs},
          {"mfu", r.pred.mfu}});
    llvm::json::Object o{{"world", req.world},
                         {"global_batch", req.globalBatch},
                         {"profile", req.profile.source},
                         {"priced", int64_t(res.considered)},
                         {"feasible", int64_t(res.feasible)},
                         {"search_seconds", res.searchSeconds},
                         {"top", std::move(rows)}};
    for (auto &kv : checked)
      o[kv.first] = std::move(kv.second);
    std::error_code ec;
    llvm::raw_fd_ostream os(report, ec);
    if (ec)
      return fail(module, "report: cannot write '" + report + "' (" +
                              ec.message() + ")");
    os << llvm::json::Value(std::move(o)) << "\n";
    return success();
  }

  /// The memory planner's peak over the stages of the compiled module.
  FailureOr<uint64_t> plannerPeak(ModuleOp module, int64_t &worstStage) {
    FailureOr<StepStructure> step = StepStructure::analyze(module);
    if (failed(step))
      return failure();
    uint64_t peak = 0;
    for (int64_t s = 0; s < step->layout.pp; ++s) {
      FailureOr<StageMemory> mem = planStageMemory(module, *step, s);
      if (failed(mem) || failed(applyMemCap(module, step->layout, *mem)))
        return failure();
      if (mem->peakBytes() > peak) {
        peak = mem->peakBytes();
        worstStage = s;
      }
    }
    return peak;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(run(module)))
      signalPassFailure();
  }

  LogicalResult run(ModuleOp module) {
    if (world < 1)
      return fail(module, "world must be >= 1 (world=N: the devices)");
    if (globalBatch < 1)
      return fail(module, "global-batch must be >= 1 (sequences per step)");
    if (memCapGib < 0)
      return fail(module, "mem-cap-gib must be >= 0");
    int64_t graphMbs = 0;
    FailureOr<cost::ModelDims> dims = modelDimsOf(module, graphMbs);
    if (failed(dims))
      return failure();
    if (graphMbs)
      module.emitRemark("mapp-auto-parallel: no mapp.model; read from the "
                        "graph: ")
          << dims->layers << " layers, hidden " << dims->hidden << ", "
          << dims->heads << " heads (" << dims->kvHeads << " KV), MLP "
          << dims->ffn << (dims->llama ? " gated" : "")
          << (dims->experts ? ", " + std::to_string(dims->experts) +
                                  " experts top-" + std::to_string(dims->topk)
                            : std::string())
          << ", vocabulary "
          << dims->vocab << ", sequence " << dims->seq << ", "
          << (dims->tiedEmbeddings ? "tied" : "untied")
          << " embeddings; micro-batch " << graphMbs
          << " (the graph's shapes fix it)";
    cost::SearchRequest req;
    req.model = *dims;
    req.world = world;
    req.globalBatch = globalBatch;
    req.memCapBytes = memCapGib * 1073741824.0;
    // The planner checks every candidate before it is chosen, so layouts a
    // little over the cap by the formula stay in the running.
    req.capSlack = searchOnly ? 0 : kPlannerCheckedSlack;
    req.top = top;
    std::string err;
    if (cluster.empty()) {
      req.cluster.deviceKind = "cpu";
      req.cluster.devicesPerNode = world;
      req.cluster.source = "one node of CPU ranks";
    } else if (!cost::loadCluster(cluster, req.cluster, &err)) {
      return fail(module, "cluster " + err);
    }
    cost::Profile measured;
    if (!profile.empty() && !cost::loadProfile(profile, measured, &err))
      return fail(module, "profile " + err);
    std::vector<std::string> warnings;
    req.profile = cost::effectiveProfile(
        req.cluster, profile.empty() ? nullptr : &measured, warnings);
    for (const std::string &w : warnings)
      module.emitWarning("mapp-auto-parallel: ") << w;
    if (claimSamplesPerS > 0) {
      if (!cost::checkThroughputClaim(req.model, claimSamplesPerS, world,
                                      req.profile, &err))
        return fail(module, err);
      module.emitRemark("mapp-auto-parallel: ")
          << claimSamplesPerS << " samples/s is within the "
          << req.profile.deviceKind << "'s peak";
    }
    if (failed(space(module, req.space)))
      return failure();
    if (graphMbs) {
      // A generic export cannot be re-imported at another micro-batch.
      if (!microBatches.empty() &&
          req.space.microBatches != std::vector<int>{int(graphMbs)})
        return fail(module, "micro-batches=" + microBatches +
                                ": the exported graph fixes micro-batch " +
                                Twine(graphMbs) +
                                " (export again at another size, or import "
                                "a config with mapp-translate)");
      req.space.microBatches = {int(graphMbs)};
    }
    cost::SearchResult res;
    if (!cost::search(req, res, &err))
      return fail(module, err);
    llvm::errs() << cost::formatRanking(req, res);
    Builder b(&getContext());
    if (searchOnly) {
      if (!report.empty() && failed(writeReport(module, req, res)))
        return failure();
      const cost::Ranked &w = res.top.front();
      module->setAttr("mapp.auto_parallel",
                      b.getDictionaryAttr({
                          b.getNamedAttr("layout", b.getStringAttr(
                                                       w.layout.brief())),
                          b.getNamedAttr("predicted_step_ms",
                                         b.getF64FloatAttr(w.pred.stepMs)),
                          b.getNamedAttr("predicted_peak_bytes",
                                         b.getF64FloatAttr(w.pred.peakBytes)),
                      }));
      return success();
    }
    // Compile the best; the memory planner has the last word on memory.
    double cap = req.memCapBytes > 0
                     ? req.memCapBytes
                     : req.profile.memoryGiB * 1073741824.0;
    OwningOpRef<ModuleOp> original = module.clone();
    auto modelAttr = module->getAttrOfType<DictionaryAttr>("mapp.model");
    int64_t importedMbs =
        graphMbs ? graphMbs : intKey(modelAttr, "micro_batch_size", 1);
    llvm::json::Array checks;
    auto writeChecked = [&](std::optional<size_t> chosen) {
      llvm::json::Object extra{{"checked", std::move(checks)}};
      extra["chosen"] = chosen ? llvm::json::Value(int64_t(*chosen + 1))
                               : llvm::json::Value(nullptr);
      return report.empty()
                 ? success()
                 : writeReport(module, req, res, std::move(extra));
    };
    for (size_t i = 0; i < res.top.size(); ++i) {
      const cost::Layout &l = res.top[i].layout;
      if (i > 0)
        replaceModule(module, *original);
      if (l.microBatch != importedMbs) {
        OwningOpRef<ModuleOp> again = importGPTConfig(
            configJson(modelAttr, l.microBatch), &getContext(),
            "<mapp.model>");
        if (!again)
          return fail(module, "re-importing the model at micro-batch " +
                                  Twine(l.microBatch) + " failed");
        replaceModule(module, *again);
      }
      if (l.storage == cost::DType::BF16)
        module->setAttr(kActivationStorageAttr, b.getStringAttr("bf16"));
      std::string opts = l.pipelineOptions();
      if (!pipeline.empty())
        opts += " " + pipeline;
      OpPassManager pm(ModuleOp::getOperationName());
      std::string perr;
      llvm::raw_string_ostream perrs(perr);
      if (failed(parsePassPipeline("mapp-train-pipeline{" + opts + "}", pm,
                                   perrs)))
        return fail(module, "the winner's pipeline '" + opts +
                                "' does not parse: " + perr);
      if (failed(runPipeline(pm, module)))
        return fail(module, "compiling " + l.brief() + " failed");
      int64_t stage = 0;
      FailureOr<uint64_t> planned = plannerPeak(module, stage);
      if (failed(planned))
        return failure();
      // The device holds the plan's blocks and what the backend keeps
      // beside them (weight shadows, workspaces): the cap covers both.
      double outside = res.top[i].pred.outsidePlanBytes;
      double peak = double(*planned) + outside;
      llvm::errs() << "auto-parallel: #" << i + 1 << " " << l.brief()
                   << ": memory planner " << gib(*planned) << " (stage "
                   << stage << ") + beside the plan " << gib(outside) << " = "
                   << gib(peak) << ", predicted "
                   << gib(res.top[i].pred.peakBytes) << ", cap " << gib(cap)
                   << "\n";
      checks.push_back(llvm::json::Object{
          {"rank", int64_t(i + 1)},
          {"planned_peak_bytes", int64_t(*planned)},
          {"outside_plan_bytes", outside},
          {"fits", peak <= cap}});
      if (peak > cap)
        continue;
      llvm::errs() << "auto-parallel: chose " << l.brief() << " ("
                   << opts << ")\n";
      module->setAttr(
          "mapp.auto_parallel",
          b.getDictionaryAttr({
              b.getNamedAttr("layout", b.getStringAttr(l.brief())),
              b.getNamedAttr("options", b.getStringAttr(opts)),
              b.getNamedAttr("predicted_step_ms",
                             b.getF64FloatAttr(res.top[i].pred.stepMs)),
              b.getNamedAttr("predicted_peak_bytes",
                             b.getF64FloatAttr(res.top[i].pred.peakBytes)),
              b.getNamedAttr("planned_peak_bytes",
                             b.getI64IntegerAttr(int64_t(*planned))),
              b.getNamedAttr("outside_plan_bytes",
                             b.getF64FloatAttr(outside)),
          }));
      return writeChecked(i);
    }
    if (failed(writeChecked(std::nullopt)))
      return failure();
    return fail(module, "the memory planner puts each of the " +
                            Twine(res.top.size()) +
                            " best layouts over the cap of " + gib(cap) +
                            " (see the lines above): raise top= or the cap");
  }
};

} // namespace

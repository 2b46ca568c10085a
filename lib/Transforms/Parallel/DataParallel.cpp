// --mapp-data-parallel: bucketed gradient synchronization over dp, placed in
// the backward functions so a bucket's collective can start as soon as its
// gradients are final (overlapping the rest of the backward), plus the
// pipeline-stage sum of tied parameters and optional ZeRO-1.
//
// Gradients accumulate over microbatches, so a bucket's gradients are final
// only during the step's last microbatch: `mapp.grad_sync` is the explicit
// marker the runtime executes on that microbatch only (docs/plan-lowering.md).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <cmath>

namespace mapp {
#define GEN_PASS_DEF_MAPPDATAPARALLEL
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

int64_t intAttr(Operation *op, StringRef name, int64_t fallback) {
  if (auto a = op->getAttrOfType<IntegerAttr>(name))
    return a.getInt();
  return fallback;
}

struct DataParallelPass : mapp::impl::MappDataParallelBase<DataParallelPass> {
  using Base::Base;

  int64_t nextBucket = 0;
  int64_t ep = 1;
  llvm::DenseSet<StringAttr> expertParams;

  /// Megatron sums expert gradients over edp and scales them by 1/dp (its
  /// expert_gradient_scaling_factor): each expert saw the tokens of its ep
  /// group, so an avg over edp (dp/ep ranks) needs a further 1/ep. Applied
  /// to every microbatch's gradient before it is accumulated (exact for a
  /// power-of-two ep).
  void scaleExpertGrads(func::FuncOp fn) {
    SmallVector<GradAccumulateOp> accs;
    fn.walk([&](GradAccumulateOp acc) {
      if (expertParams.contains(acc.getParamAttr().getAttr()))
        accs.push_back(acc);
    });
    for (GradAccumulateOp acc : accs) {
      Value g = acc.getGrad();
      OpBuilder b(acc);
      if (g.getDefiningOp() && g.getDefiningOp()->getBlock() == acc->getBlock())
        b.setInsertionPointAfterValue(g);
      auto s = b.create<ScaleOp>(acc.getLoc(), g.getType(), g,
                                 b.getF64FloatAttr(1.0 / double(ep)));
      s->setAttr("mapp.name",
                 b.getStringAttr(acc.getParam() + ".ep_grad_scale"));
      acc.getGradMutable().assign(s);
    }
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (dp < 1 || !(bucketMb > 0) || !std::isfinite(bucketMb)) {
      module.emitError("mapp-data-parallel: dp must be >= 1 and bucket-mb > 0");
      return signalPassFailure();
    }
    // The world is complete here: tp and pp come from the passes before.
    if (failed(checkAtMost(module, "mapp-data-parallel", "dp", dp, kMaxDegree,
                           kMaxDegreeWhy)) ||
        failed(checkAtMost(module, "mapp-data-parallel", "world size tp*pp*dp",
                           worldSize(getParallelInt(module, "tp", 1),
                                     getParallelInt(module, "pp", 1), dp),
                           kMaxDegree, kMaxDegreeWhy)))
      return signalPassFailure();
    SmallVector<func::FuncOp> backwards;
    for (auto fn : module.getOps<func::FuncOp>())
      if (auto phase = fn->getAttrOfType<StringAttr>("mapp.phase"))
        if (phase.getValue() == "backward")
          backwards.push_back(fn);
    if (backwards.empty()) {
      module.emitError("mapp-data-parallel: no backward function "
                       "(mapp.phase = \"backward\"); run --mapp-autodiff first");
      return signalPassFailure();
    }
    auto optimizerStep = module.lookupSymbol<func::FuncOp>("optimizer_step");
    if (zero1 && dp > 1 && !optimizerStep) {
      module.emitError("mapp-data-parallel: zero1 shards the optimizer "
                       "state: run --mapp-optimizer first");
      return signalPassFailure();
    }
    setParallelInt(module, "dp", dp);

    // Expert parallelism (--mapp-expert-parallel) lives inside dp: the
    // expert weights (shard_group "ep") are synchronized over the
    // expert-data-parallel group "edp" instead of dp.
    ep = getParallelInt(module, "ep", 1);
    if (ep < 1 || dp % ep != 0) {
      module.emitError("mapp-data-parallel: ep=")
          << ep << " does not divide dp=" << dp.getValue()
          << " (expert parallelism lives inside the data-parallel group: "
             "world = tp*pp*dp, the ep group is ep of the dp ranks)";
      return signalPassFailure();
    }
    if (ep > 1 && zero1) {
      module.emitError("mapp-data-parallel: zero1 with ep=")
          << ep << " is not supported (the expert weights' optimizer state "
                   "would be sharded over edp, not dp)";
      return signalPassFailure();
    }
    for (auto p : module.getOps<ParamOp>())
      if (p.getShardDimAttr() && p.getShardGroupAttr() &&
          p.getShardGroupAttr().getValue() == "ep")
        expertParams.insert(p.getSymNameAttr());
    if (ep > 1)
      for (func::FuncOp fn : backwards)
        scaleExpertGrads(fn);

    // Where each parameter's gradient is accumulated, per pipeline stage
    // (each stage's dp group synchronizes its own replica).
    using Where = llvm::MapVector<std::pair<StringAttr, int64_t>,
                                  llvm::SmallSetVector<func::FuncOp, 2>>;
    Where where;
    llvm::DenseMap<std::pair<int64_t, int64_t>, func::FuncOp> byStageChunk;
    for (func::FuncOp fn : backwards) {
      int64_t stage = intAttr(fn, "mapp.stage", 0);
      byStageChunk[{stage, intAttr(fn, "mapp.chunk", 0)}] = fn;
      fn.walk([&](GradAccumulateOp acc) {
        where[{acc.getParamAttr().getAttr(), stage}].insert(fn);
      });
    }

    // Parameters accumulated by one function of a stage are synchronized
    // there, in buckets; those accumulated by several chunks of a stage
    // only once all of them ran, at the end of chunk 0's backward (the last
    // backward of every schedule the compiler generates).
    llvm::MapVector<func::FuncOp, SmallVector<StringAttr>> late;
    for (auto &[key, fns] : where)
      if (fns.size() > 1) {
        func::FuncOp last = byStageChunk.lookup({key.second, 0});
        if (!last) {
          module.emitError("mapp-data-parallel: no chunk 0 backward on stage ")
              << key.second;
          return signalPassFailure();
        }
        late[last].push_back(key.first);
      }

    // Tied parameters (mapp.pp_stages): sum their gradients over the stages
    // holding a replica, at the very end of chunk 0's backward — the last
    // task of each stage — so the collective cannot block the pipeline.
    SmallVector<ParamOp> tied;
    for (auto p : module.getOps<ParamOp>())
      if (p->hasAttr("mapp.pp_stages"))
        tied.push_back(p);
    llvm::sort(tied, [](ParamOp a, ParamOp b) {
      return a.getSymName() < b.getSymName();
    });
    llvm::DenseSet<std::pair<StringAttr, int64_t>> tiedOn;
    for (ParamOp p : tied) {
      auto stages = p->getAttrOfType<DenseI64ArrayAttr>("mapp.pp_stages");
      for (int64_t s : stages.asArrayRef()) {
        func::FuncOp fn = byStageChunk.lookup({s, 0});
        if (!fn) {
          p.emitError("mapp-data-parallel: no chunk 0 backward on stage ") << s;
          return signalPassFailure();
        }
        // Its dp sync follows the stage sum (a reduce-scatter first would
        // leave only a slice valid to sum): it goes in the late bucket.
        if (tiedOn.insert({p.getSymNameAttr(), s}).second &&
            where[{p.getSymNameAttr(), s}].size() <= 1)
          late[fn].push_back(p.getSymNameAttr());
        OpBuilder b(fn.getBody().front().getTerminator());
        b.create<GradSyncOp>(
            p.getLoc(),
            b.getArrayAttr({FlatSymbolRefAttr::get(p.getSymNameAttr())}),
            StringAttr(), stages, b.getStringAttr("all_reduce"),
            b.getStringAttr("sum"), b.getI64IntegerAttr(nextBucket));
      }
      ++nextBucket;
    }

    // Bucket ids → (stage, params).
    llvm::MapVector<int64_t, std::pair<int64_t, SmallVector<StringAttr>>>
        buckets;
    // A parameter synchronized late on a stage is in no other bucket of that
    // stage (a tied parameter accumulated by another chunk than 0 would
    // otherwise be in two buckets, and ZeRO-1 would own two slices of it).
    llvm::DenseSet<std::pair<StringAttr, int64_t>> lateOnStage;
    for (auto &[fn, names] : late)
      for (StringAttr n : names)
        lateOnStage.insert({n, intAttr(fn, "mapp.stage", 0)});
    for (func::FuncOp fn : backwards)
      if (dp > 1)
        bucketize(fn, where, late.lookup(fn), lateOnStage, buckets);

    if (zero1 && dp > 1)
      shardOptimizer(optimizerStep, buckets);
  }

  /// Moves each grad_accumulate right after its gradient is computed and
  /// closes a bucket (a grad_sync) whenever `bucket-mb` of gradients are
  /// final; params in `lateParams` go in a last bucket at the end.
  template <typename Where>
  void bucketize(func::FuncOp fn, Where &where,
                 ArrayRef<StringAttr> lateParams,
                 const llvm::DenseSet<std::pair<StringAttr, int64_t>> &lateOnStage,
                 llvm::MapVector<int64_t, std::pair<int64_t, SmallVector<StringAttr>>>
                     &buckets) {
    int64_t stage = intAttr(fn, "mapp.stage", 0);
    llvm::DenseSet<StringAttr> lateSet(lateParams.begin(), lateParams.end());
    SmallVector<GradAccumulateOp> accs;
    fn.walk([&](GradAccumulateOp acc) { accs.push_back(acc); });
    for (GradAccumulateOp acc : accs)
      if (Operation *def = acc.getGrad().getDefiningOp())
        acc->moveAfter(def);
    // Program order now is the order gradients become final.
    accs.clear();
    fn.walk([&](GradAccumulateOp acc) { accs.push_back(acc); });

    const double limit = bucketMb * 1024.0 * 1024.0;
    OpBuilder b(&getContext());
    // Dense gradients over dp, expert gradients (ep > 1) over edp: each
    // group has its own open bucket. With ep = dp every edp group is one
    // rank and the expert buckets are left out.
    struct Open {
      SmallVector<Attribute> params;
      double bytes = 0;
      Operation *lastAcc = nullptr;
    };
    Open dense, expert;
    auto close = [&](Open &o, bool isExpert, Operation *after, Location loc) {
      if (o.params.empty())
        return;
      if (isExpert && dp / ep == 1) {
        o = Open();
        return;
      }
      if (after)
        b.setInsertionPointAfter(after);
      else
        b.setInsertionPoint(fn.getBody().front().getTerminator());
      b.create<GradSyncOp>(loc, b.getArrayAttr(o.params),
                           b.getStringAttr(isExpert ? "edp" : "dp"),
                           DenseI64ArrayAttr(),
                           b.getStringAttr(zero1 ? "reduce_scatter"
                                                 : "all_reduce"),
                           b.getStringAttr("avg"),
                           b.getI64IntegerAttr(nextBucket));
      auto &[bucketStage, names] = buckets[nextBucket++];
      bucketStage = stage;
      for (Attribute a : o.params)
        names.push_back(cast<FlatSymbolRefAttr>(a).getAttr());
      o = Open();
    };
    for (GradAccumulateOp acc : accs) {
      StringAttr name = acc.getParamAttr().getAttr();
      if (where[{name, stage}].size() > 1 || lateSet.contains(name) ||
          lateOnStage.contains({name, stage}))
        continue; // synchronized at the end (several chunks, or tied)
      bool isExpert = expertParams.contains(name);
      Open &o = isExpert ? expert : dense;
      o.params.push_back(acc.getParamAttr());
      o.bytes += tensorBytes(acc.getGrad().getType());
      o.lastAcc = acc;
      if (o.bytes >= limit)
        close(o, isExpert, acc, acc.getLoc());
    }
    close(dense, false, dense.lastAcc, fn.getLoc());
    close(expert, true, expert.lastAcc, fn.getLoc());
    // The late buckets: after everything else in the function.
    for (StringAttr name : lateParams)
      (expertParams.contains(name) ? expert : dense)
          .params.push_back(FlatSymbolRefAttr::get(name));
    close(dense, false, nullptr, fn.getLoc());
    close(expert, true, nullptr, fn.getLoc());
  }

  /// ZeRO-1: each dp rank updates only its slice of every bucket (the update
  /// ops and the norm carry `mapp.zero_shard = "dp"`), then the buckets'
  /// updated parameters are all-gathered.
  void shardOptimizer(
      func::FuncOp step,
      llvm::MapVector<int64_t, std::pair<int64_t, SmallVector<StringAttr>>>
          &buckets) {
    MLIRContext *ctx = &getContext();
    llvm::DenseSet<StringAttr> inBucket;
    for (auto &[id, bucket] : buckets)
      inBucket.insert(bucket.second.begin(), bucket.second.end());
    auto mark = StringAttr::get(ctx, "dp");
    step.walk([&](Operation *op) {
      if (auto a = dyn_cast<AdamWOp>(op)) {
        if (inBucket.contains(a.getParamAttr().getAttr()))
          op->setAttr("mapp.zero_shard", mark);
      } else if (auto s = dyn_cast<SGDOp>(op)) {
        if (inBucket.contains(s.getParamAttr().getAttr()))
          op->setAttr("mapp.zero_shard", mark);
      } else if (isa<GlobalNormOp>(op)) {
        op->setAttr("mapp.zero_shard", mark);
      }
    });
    OpBuilder b(step.getBody().front().getTerminator());
    for (auto &[id, bucket] : buckets) {
      SmallVector<Attribute> refs;
      for (StringAttr n : bucket.second)
        refs.push_back(FlatSymbolRefAttr::get(n));
      auto gather = b.create<ParamGatherOp>(step.getLoc(), b.getArrayAttr(refs),
                                            b.getStringAttr("dp"),
                                            b.getI64IntegerAttr(id));
      // A tied parameter is in one bucket per stage: say whose this is.
      gather->setAttr("mapp.stage", b.getI64IntegerAttr(bucket.first));
    }
  }
};

} // namespace

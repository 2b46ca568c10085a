// --mapp-split-fwd-bwd (MegaFBD): each pipeline stage's forward runs as its
// own placed subgraph on separate ranks and feeds the backward side, either
// with the saved activations or with the stage input only (recompute).
// Passes.td and docs/megafbd.md describe the result; this file builds it.
#include "Reshard.h"
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPSPLITFWDBWD
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// IR tag of the i-th transfer from a forward rank to its backward rank.
/// Forward→backward pairs carry nothing else, so any tag is free; 1000
/// keeps them apart from the pipeline's 2i / 2i+1 in traces.
constexpr int64_t kCrossTag = 1000;

struct SplitFwdBwdPass : mapp::impl::MappSplitFwdBwdBase<SplitFwdBwdPass> {
  using Base::Base;

  ModuleOp module;
  int64_t T1 = 1, T2 = 1, pp = 1, dp = 1;
  /// The forward graph's unsharded value types (fwd-tp ≠ bwd-tp).
  fbd::GlobalTypes globalTypes;

  bool reshards() const { return transfer == "activations" && T1 != T2; }

  InFlightDiagnostic fail(Operation *op, const Twine &msg) {
    return op->emitError("mapp-split-fwd-bwd: ") << msg;
  }

  void runOnOperation() override {
    module = getOperation();
    if (failed(run()))
      signalPassFailure();
  }

  LogicalResult checkOptions() {
    if (transfer != "activations" && transfer != "recompute")
      return fail(module, "transfer must be activations or recompute, got '")
             << transfer << "'";
    for (auto [name, dev] : {std::pair<const char *, std::string>{
                                 "fwd-device", fwdDevice},
                             {"bwd-device", bwdDevice}})
      if (dev != "cpu" && dev != "cuda")
        return fail(module, name) << " must be cpu or cuda, got '" << dev
                                  << "'";
    if (fwdIndex < 0 || bwdIndex < 0)
      return fail(module, "device indices must be >= 0");
    if (fwdTp < 0 || bwdTp < 0)
      return fail(module, "fwd-tp and bwd-tp must be >= 1");
    if (failed(checkAtMost(module, "mapp-split-fwd-bwd", "fwd-tp", fwdTp,
                           kMaxDegree, kMaxDegreeWhy)))
      return failure();
    if (module->hasAttr("mapp.fbd"))
      return fail(module, "the module is already split (mapp.fbd)");
    int64_t tp = getParallelInt(module, "tp", 1);
    pp = getParallelInt(module, "pp", 1);
    dp = getParallelInt(module, "dp", 1);
    T2 = bwdTp > 0 ? (int64_t)bwdTp : tp;
    T1 = fwdTp > 0 ? (int64_t)fwdTp : tp;
    if (T2 != tp)
      return fail(module, "bwd-tp=")
             << T2 << " differs from the module's tp=" << tp
             << ": the backward side is the module's training step (build it "
                "with tp=" << T2 << ")";
    if (getParallelInt(module, "chunks", 1) != 1)
      return fail(module, "interleaved chunks are not supported (chunks=")
             << getParallelInt(module, "chunks", 1) << ")";
    if (T1 != T2 && transfer == "activations" && T1 % T2 && T2 % T1)
      return fail(module, "transfer=activations between fwd-tp=")
             << T1 << " and bwd-tp=" << T2
             << " needs one degree to divide the other (a backward rank's "
                "piece of a saved activation must lie in one forward piece "
                "or span whole ones)";
    return success();
  }

  /// The forward block of every stage (one chunk).
  LogicalResult stageForwards(const StepStructure &step,
                              SmallVector<func::FuncOp> &fwds) {
    fwds.assign(pp, nullptr);
    bool anyBackward = false;
    for (const StepBlock &b : step.blocks) {
      if (b.phase == Phase::BackwardInput || b.phase == Phase::BackwardWeight)
        return fail(b.func, "split backward (zero-bubble) blocks are not "
                            "supported");
      anyBackward |= b.phase == Phase::Backward;
      if (b.phase == Phase::Forward)
        fwds[b.stage] = b.func;
    }
    if (!anyBackward)
      return fail(module, "no backward function: run it on a training step "
                          "(after --mapp-autodiff)");
    for (int64_t s = 0; s < pp; ++s)
      if (!fwds[s])
        return fail(module, "stage ") << s << " has no forward function";
    return success();
  }

  /// A module holding `fn` and the parameters it reads.
  OwningOpRef<ModuleOp> cloneStage(ModuleOp from, func::FuncOp fn) {
    OwningOpRef<ModuleOp> m = ModuleOp::create(fn.getLoc());
    for (NamedAttribute a : from->getAttrs())
      if (a.getName() != "mapp.fbd_source" && a.getName() != "sym_name")
        (*m)->setAttr(a.getName(), a.getValue());
    llvm::DenseSet<StringAttr> used;
    fn.walk([&](ParamRefOp r) { used.insert(r.getParamAttr().getAttr()); });
    OpBuilder b = OpBuilder::atBlockEnd(m->getBody());
    for (ParamOp p : from.getOps<ParamOp>())
      if (used.contains(p.getSymNameAttr()))
        b.clone(*p);
    b.clone(*fn);
    return m;
  }

  static llvm::SmallSetVector<StringAttr, 8> paramsOf(func::FuncOp fn) {
    llvm::SmallSetVector<StringAttr, 8> out;
    fn.walk([&](ParamRefOp r) { out.insert(r.getParamAttr().getAttr()); });
    return out;
  }

  /// The forward side at fwd-tp from `mapp.fbd_source`: tensor-parallel and
  /// pipeline-partition run again on the forward graph.
  LogicalResult forwardsFromSource(ArrayRef<func::FuncOp> bwdFwds,
                                   SmallVector<OwningOpRef<ModuleOp>> &out) {
    auto src = module->getAttrOfType<StringAttr>("mapp.fbd_source");
    if (!src)
      return fail(module, "fwd-tp=")
             << T1 << " differs from bwd-tp=" << T2
             << ": the forward side is tensor-parallelized again from the "
                "forward graph, which the module does not carry (run "
                "--mapp-fbd-keep-source first, or --mapp-train-pipeline with "
                "fbd=true)";
    ParserConfig config(&getContext());
    OwningOpRef<ModuleOp> parsed =
        parseSourceString<ModuleOp>(src.getValue(), config);
    if (!parsed)
      return fail(module, "mapp.fbd_source does not parse");
    ModuleOp nested = parsed.release();
    fbd::collectGlobalTypes(nested, globalTypes);
    module.getBody()->push_back(nested);
    OpPassManager pm(ModuleOp::getOperationName());
    MappTensorParallelOptions tpo;
    tpo.tp = T1;
    pm.addPass(createMappTensorParallel(tpo));
    MappPipelinePartitionOptions ppo;
    ppo.pp = pp;
    pm.addPass(createMappPipelinePartition(ppo));
    LogicalResult ran = runPipeline(pm, nested);
    nested->remove();
    OwningOpRef<ModuleOp> owned(nested);
    if (failed(ran))
      return failure(); // the passes reported where
    out.clear();
    for (int64_t s = 0; s < pp; ++s) {
      func::FuncOp fn;
      for (auto f : nested.getOps<func::FuncOp>()) {
        auto st = f->getAttrOfType<IntegerAttr>("mapp.stage");
        if ((st && st.getInt() == s) || (!st && pp == 1 &&
                                         f.getSymName() == "forward"))
          fn = f;
      }
      if (!fn)
        return fail(module, "the forward side has no function for stage ")
               << s;
      // Both sides must cut the layers alike, or the stage input the
      // forward side sends is not the one the backward side re-runs from.
      if (paramsOf(fn) != paramsOf(bwdFwds[s]))
        return fail(bwdFwds[s], "stage ")
               << s << " holds other layers at fwd-tp=" << T1
               << " than at bwd-tp=" << T2
               << " (the pipeline partition differs)";
      OwningOpRef<ModuleOp> m = cloneStage(nested, fn);
      auto sfn = *m->getOps<func::FuncOp>().begin();
      OpBuilder b(&getContext());
      sfn->setAttr("mapp.phase", b.getStringAttr("forward"));
      sfn->setAttr("mapp.stage", b.getI64IntegerAttr(s));
      out.push_back(std::move(m));
    }
    return success();
  }

  /// `op` (a send) also goes to backward ranks j + q·fwd-tp; the lowering
  /// drops the copies whose rank does not exist.
  void sendToBackward(OpBuilder &b, Location loc, Value v, int64_t stage,
                      int64_t tag) {
    int64_t copies = (T2 + T1 - 1) / T1;
    for (int64_t q = 0; q < copies; ++q) {
      auto send = b.create<SendOp>(loc, v, b.getI64IntegerAttr(stage),
                                   b.getI64IntegerAttr(tag));
      send->setAttr("fbd_cross", b.getStringAttr("bwd"));
      send->setAttr("fbd_q", b.getI64IntegerAttr(q));
    }
  }

  /// The forward side's stage: sends what the backward needs, returns
  /// nothing (the loss of record is the backward side's).
  LogicalResult rewriteForwardSide(func::FuncOp fn, int64_t stage) {
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    OpBuilder b(ret);
    if (transfer == "activations") {
      for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
        if (isa<BlockArgument>(v))
          continue; // the backward rank has its own inputs
        auto t = cast<RankedTensorType>(v.getType());
        if (!isa<FloatType>(t.getElementType()))
          return fail(fn, "saved result ")
                 << i << " is an integer tensor; transfer=activations "
                         "cannot send it";
        sendToBackward(b, ret.getLoc(), v, stage, kCrossTag + i);
      }
    } else {
      int64_t k = 0;
      for (RecvOp r : llvm::to_vector(body.getOps<RecvOp>())) {
        OpBuilder after(r->getBlock(), std::next(r->getIterator()));
        sendToBackward(after, r.getLoc(), r.getResult(), stage, kCrossTag + k++);
      }
    }
    dropResults(fn);
    return success();
  }

  /// The forward side returns nothing: the loss of record is the backward
  /// side's.
  void dropResults(func::FuncOp fn) {
    auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
    OpBuilder(ret).create<func::ReturnOp>(ret.getLoc());
    ret.erase();
    fn.setType(FunctionType::get(&getContext(),
                                 fn.getFunctionType().getInputs(), {}));
    fn->removeAttr("mapp.loss");
  }

  /// The backward side's forward block of `stage`.
  void rewriteBackwardSide(func::FuncOp fn, int64_t stage) {
    Block &body = fn.getBody().front();
    OpBuilder b(&getContext());
    if (transfer == "recompute") {
      // Re-run the forward on the stage input from the forward rank; the
      // next stage gets its input from its own forward rank.
      int64_t k = 0;
      for (RecvOp r : llvm::to_vector(body.getOps<RecvOp>())) {
        r.setTagAttr(b.getI64IntegerAttr(kCrossTag + k++));
        r->setAttr("fbd_cross", b.getStringAttr("fwd"));
      }
      for (SendOp s : llvm::to_vector(body.getOps<SendOp>()))
        s.erase();
      return;
    }
    // Activations: the block only receives the loss and saved results.
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    b.setInsertionPoint(ret);
    SmallVector<Value> vals;
    llvm::DenseSet<Operation *> keep{ret};
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      if (isa<BlockArgument>(v)) {
        vals.push_back(v);
        continue;
      }
      auto r = b.create<RecvOp>(ret.getLoc(), v.getType(),
                                b.getI64IntegerAttr(stage),
                                b.getI64IntegerAttr(kCrossTag + i));
      r->setAttr("fbd_cross", b.getStringAttr("fwd"));
      keep.insert(r);
      vals.push_back(r);
    }
    ret->setOperands(vals);
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
      if (!keep.contains(&op)) {
        op.dropAllUses();
        op.erase();
      }
  }

  /// transfer=recompute: the backward side's stages no longer feed each
  /// other's forwards (each reads its stage input from its forward rank), so
  /// a stage can recompute microbatch i's forward right before its backward.
  /// Then one microbatch's activations are alive per backward rank instead of
  /// the schedule's warm-up depth (1F1B: p - r); the stage inputs that
  /// arrive early wait in the transport. The order of backwards is kept.
  void deferForwards(ScheduleOp sched) {
    MLIRContext *ctx = &getContext();
    SmallVector<Attribute> tables;
    for (Attribute t : sched.getTables()) {
      SmallVector<Attribute> order;
      for (Attribute a : cast<ArrayAttr>(t)) {
        auto task = cast<TaskAttr>(a);
        if (task.getKind() == TaskKind::Forward)
          continue;
        if (task.getKind() == TaskKind::Backward)
          order.push_back(TaskAttr::get(ctx, TaskKind::Forward,
                                        task.getChunk(), task.getMicrobatch()));
        order.push_back(task);
      }
      tables.push_back(ArrayAttr::get(ctx, order));
    }
    sched.setTablesAttr(ArrayAttr::get(ctx, tables));
  }

  PlacementAttr placement(int64_t rank, StringRef dev, int64_t index,
                          int64_t tp) {
    return PlacementAttr::get(&getContext(), rank,
                              StringAttr::get(&getContext(),
                                              dev == "cuda" ? "gpu" : "cpu"),
                              index, tp, dp, pp);
  }

  LogicalResult run() {
    if (failed(checkOptions()))
      return failure();
    FailureOr<StepStructure> step = StepStructure::analyze(module);
    if (failed(step))
      return failure();
    SmallVector<func::FuncOp> bwdFwds;
    if (failed(stageForwards(*step, bwdFwds)))
      return failure();

    SmallVector<OwningOpRef<ModuleOp>> fwdMods;
    if (T1 != T2) {
      if (failed(forwardsFromSource(bwdFwds, fwdMods)))
        return failure();
    } else {
      for (int64_t s = 0; s < pp; ++s)
        fwdMods.push_back(cloneStage(module, bwdFwds[s]));
    }
    // The forward side runs every microbatch of the step in the module's
    // layout, at its own tp.
    auto layout = module->getAttrOfType<DictionaryAttr>(kParallelAttr);
    NamedAttrList fwdLayout;
    if (layout)
      fwdLayout = NamedAttrList(layout);
    fwdLayout.set("tp", IntegerAttr::get(IntegerType::get(&getContext(), 64), T1));
    for (int64_t s = 0; s < pp; ++s) {
      (*fwdMods[s])->setAttr(kParallelAttr, fwdLayout.getDictionary(&getContext()));
      auto fn = *fwdMods[s]->getOps<func::FuncOp>().begin();
      if (reshards()) {
        fbd::ReshardOptions ro;
        ro.fwdTp = T1;
        ro.bwdTp = T2;
        ro.stage = s;
        ro.tagBase = kCrossTag;
        int64_t n = 0;
        if (failed(fbd::reshardActivations(fn, bwdFwds[s], globalTypes, ro, n)))
          return failure();
        dropResults(fn);
        continue;
      }
      if (failed(rewriteForwardSide(fn, s)))
        return failure();
      rewriteBackwardSide(bwdFwds[s], s);
    }

    if (transfer == "recompute")
      for (ScheduleOp sched : module.getOps<ScheduleOp>())
        deferForwards(sched);

    MLIRContext *ctx = &getContext();
    OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
    int64_t nb = T2 * dp * pp, nf = T1 * dp * pp;
    for (int64_t s = 0; s < pp; ++s) {
      auto fwd = b.create<SubgraphOp>(
          module.getLoc(), b.getStringAttr("fbd_forward_s" + std::to_string(s)),
          b.getStringAttr("forward"), b.getI64IntegerAttr(s),
          placement(nb + s * T1 * dp, fwdDevice, fwdIndex, T1));
      fwd.getBody().push_back(new Block);
      fwd.getBody().front().push_back(fwdMods[s].release());
      auto bwd = b.create<SubgraphOp>(
          module.getLoc(),
          b.getStringAttr("fbd_backward_s" + std::to_string(s)),
          b.getStringAttr("backward"), b.getI64IntegerAttr(s),
          placement(s * T2 * dp, bwdDevice, bwdIndex, T2));
      bwd.getBody().push_back(new Block);
    }
    NamedAttrList fbd;
    fbd.append("fwd_tp", b.getI64IntegerAttr(T1));
    fbd.append("bwd_tp", b.getI64IntegerAttr(T2));
    fbd.append("fwd_device", b.getStringAttr(fwdDevice));
    fbd.append("bwd_device", b.getStringAttr(bwdDevice));
    fbd.append("fwd_index", b.getI64IntegerAttr(fwdIndex));
    fbd.append("bwd_index", b.getI64IntegerAttr(bwdIndex));
    fbd.append("transfer", b.getStringAttr(transfer));
    fbd.append("fwd_ranks", b.getI64IntegerAttr(nf));
    fbd.append("bwd_ranks", b.getI64IntegerAttr(nb));
    module->setAttr("mapp.fbd", fbd.getDictionary(ctx));
    module->removeAttr("mapp.fbd_source");
    return success();
  }
};

} // namespace

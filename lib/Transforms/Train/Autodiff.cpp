// --mapp-autodiff: reverse-mode gradients, split into an explicit forward and
// backward function with the saved activations in their signatures.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPAUTODIFF
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// Values cheaper to recompute in the backward than to keep alive
/// (tensor-parallel markers on parameters included).
bool isRematerializable(Operation *op) {
  if (op && isa<CopyToGroupOp, ScatterToGroupOp>(op))
    return isRematerializable(op->getOperand(0).getDefiningOp());
  return op && (isa<ParamRefOp, FillOp>(op));
}

/// Pipeline stage functions made by --mapp-pipeline-partition: forward
/// functions with a `mapp.stage` and no backward yet.
SmallVector<func::FuncOp> stageForwards(ModuleOp module) {
  SmallVector<func::FuncOp> fns;
  for (auto fn : module.getOps<func::FuncOp>()) {
    auto phase = fn->getAttrOfType<StringAttr>("mapp.phase");
    if (phase && phase.getValue() == "forward" && fn->hasAttr("mapp.stage"))
      fns.push_back(fn);
  }
  return fns;
}

/// Names gradient ops after the forward op they differentiate
/// ("layers.0.mlp.fc1" -> "layers.0.mlp.fc1.grad"), so traces, probes and
/// cost reports can place backward work in its layer.
struct GradientNamer : OpBuilder::Listener {
  explicit GradientNamer(Operation *forward)
      : name(forward->getAttrOfType<StringAttr>("mapp.name")) {}
  void notifyOperationInserted(Operation *op,
                               OpBuilder::InsertPoint) override {
    if (name && !op->hasAttr("mapp.name"))
      op->setAttr("mapp.name",
                  StringAttr::get(op->getContext(), name.str() + ".grad"));
  }
  StringAttr name;
};

/// Records on the op defining each final result gradient which named forward
/// value it is the gradient of (`mapp.grad_of`, one string per result, ""
/// for none), so probes can address gradients as `grad:<mapp.name>`.
void tagGradOf(Operation *op, ArrayRef<Value> dys) {
  auto name = op->getAttrOfType<StringAttr>("mapp.name");
  if (!name || op->getNumResults() != 1 || !dys[0] || !dys[0].getDefiningOp())
    return;
  Operation *def = dys[0].getDefiningOp();
  auto res = cast<OpResult>(dys[0]);
  MLIRContext *ctx = op->getContext();
  SmallVector<Attribute> names(def->getNumResults(), StringAttr::get(ctx, ""));
  if (auto old = def->getAttrOfType<ArrayAttr>("mapp.grad_of"))
    names.assign(old.begin(), old.end());
  if (cast<StringAttr>(names[res.getResultNumber()]).empty())
    names[res.getResultNumber()] = name;
  def->setAttr("mapp.grad_of", ArrayAttr::get(ctx, names));
}

struct AutodiffPass : mapp::impl::MappAutodiffBase<AutodiffPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fwd = module.lookupSymbol<func::FuncOp>(entry);
    // A pipelined forward: differentiate every stage function.
    if (!fwd && !stageForwards(module).empty()) {
      for (func::FuncOp stageFwd : stageForwards(module))
        if (failed(differentiateStage(module, stageFwd)))
          return signalPassFailure();
      return;
    }
    if (!fwd) {
      module.emitError("mapp-autodiff: no function @") << entry
                                                       << " to differentiate";
      return signalPassFailure();
    }
    if (fwd.getBody().getBlocks().size() != 1 ||
        fwd.getFunctionType().getNumResults() != 1 ||
        fwd.getFunctionType().getResult(0) !=
            RankedTensorType::get({}, Float32Type::get(&getContext()))) {
      fwd.emitError("mapp-autodiff: @")
          << entry << " must have one block and return one tensor<f32> loss";
      return signalPassFailure();
    }
    if (module.lookupSymbol("train_forward") ||
        module.lookupSymbol("train_backward")) {
      module.emitError("mapp-autodiff: module is already differentiated");
      return signalPassFailure();
    }
    fwd->setAttr("mapp.loss", UnitAttr::get(&getContext()));
    if (failed(differentiate(module, fwd, "train_forward", "train_backward")))
      return signalPassFailure();
  }

  /// A pipeline stage: `@forward_s<S>_c<C>` gets `@backward_s<S>_c<C>`.
  LogicalResult differentiateStage(ModuleOp module, func::FuncOp fwd) {
    StringRef name = fwd.getSymName();
    if (!name.starts_with("forward"))
      return fwd.emitError("mapp-autodiff: stage function @")
             << name << " should be named forward_*";
    std::string bwdName = ("backward" + name.drop_front(7)).str();
    if (module.lookupSymbol(bwdName))
      return fwd.emitError("mapp-autodiff: @") << bwdName << " exists already";
    auto type = fwd.getFunctionType();
    bool hasLoss = fwd->hasAttr("mapp.loss");
    if (fwd.getBody().getBlocks().size() != 1 ||
        type.getNumResults() != (hasLoss ? 1u : 0u))
      return fwd.emitError("mapp-autodiff: stage function @")
             << name << " must have one block and return the loss (only "
             << "with mapp.loss)";
    return differentiate(module, fwd, name, bwdName);
  }

  /// Differentiates `fwd`. Seeds: d(loss) = loss-scale when it returns the
  /// loss, and for every `mapp.send` of an activation to a later pipeline
  /// stage, its gradient received back from that stage (tag + 1). The
  /// gradient of a `mapp.recv`'d activation is sent back to its producer
  /// (tag + 1; zeros when nothing here depends on it, so the producer's
  /// receive is always matched).
  LogicalResult differentiate(ModuleOp module, func::FuncOp fwd,
                              StringRef fwdName, StringRef bwdName) {
    Block &body = fwd.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Value loss = ret.getNumOperands() ? ret.getOperand(0) : Value();

    // Values on a path from a parameter (or a received activation) to the
    // loss (or a sent activation) need gradients.
    llvm::DenseSet<Value> active;
    for (Operation &op : body.without_terminator()) {
      bool fromParam = isa<ParamRefOp, RecvOp>(op) ||
                       llvm::any_of(op.getOperands(), [&](Value v) {
                         return active.contains(v);
                       });
      if (fromParam)
        for (Value r : op.getResults())
          active.insert(r);
    }
    bool anySend = false;
    for (auto send : body.getOps<SendOp>())
      anySend |= active.contains(send.getX());
    if (loss ? !active.contains(loss) : !anySend)
      return fwd.emitError("mapp-autodiff: the loss does not depend on any "
                           "parameter");

    // Build the backward at the end of the forward, then move it out.
    OpBuilder b(ret);
    Location loc = ret.getLoc();
    llvm::DenseMap<Value, Value> grads;
    auto accumulate = [&](Value v, Value g) {
      auto [it, inserted] = grads.try_emplace(v, g);
      if (!inserted)
        it->second = b.create<AddOp>(loc, v.getType(), it->second, g);
    };
    SmallVector<Operation *> forwardOps;
    for (Operation &op : body.without_terminator())
      forwardOps.push_back(&op);
    Operation *firstBackward = nullptr;
    if (loss) {
      auto seed = b.create<FillOp>(loc, loss.getType(),
                                   b.getF64FloatAttr(lossScale));
      // --mapp-mixed-precision scales this seed by the runtime loss scale.
      seed->setAttr("mapp.loss_seed", b.getUnitAttr());
      grads[loss] = seed;
      firstBackward = seed;
    }

    for (Operation *op : llvm::reverse(forwardOps)) {
      b.setInsertionPoint(ret);
      if (auto send = dyn_cast<SendOp>(op)) {
        if (!active.contains(send.getX()))
          continue;
        auto recv = b.create<RecvOp>(
            send.getLoc(), send.getX().getType(), send.getPeerAttr(),
            b.getI64IntegerAttr(send.getTagAttr().getInt() + 1));
        if (!firstBackward)
          firstBackward = recv;
        accumulate(send.getX(), recv);
        continue;
      }
      if (auto recv = dyn_cast<RecvOp>(op)) {
        Value g = grads.lookup(recv.getResult());
        if (!g)
          g = b.create<FillOp>(recv.getLoc(), recv.getType(),
                               b.getF64FloatAttr(0.0));
        b.create<SendOp>(recv.getLoc(), g, recv.getPeerAttr(),
                         b.getI64IntegerAttr(recv.getTagAttr().getInt() + 1));
        continue;
      }
      SmallVector<Value> dys;
      bool any = false;
      for (Value r : op->getResults()) {
        auto it = grads.find(r);
        dys.push_back(it == grads.end() ? Value() : it->second);
        any |= it != grads.end();
      }
      if (!any || isa<ParamRefOp>(op))
        continue;
      tagGradOf(op, dys);
      auto rule = dyn_cast<GradientOpInterface>(op);
      if (!rule)
        return op->emitOpError("has no gradient rule, but the loss depends on "
                               "it through a parameter");
      SmallVector<Value> operandGrads;
      b.setInsertionPoint(ret);
      GradientNamer namer(op);
      b.setListener(&namer);
      LogicalResult built = rule.buildGradient(b, dys, operandGrads);
      b.setListener(nullptr);
      if (failed(built))
        return failure();
      for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads))
        if (g && active.contains(operand))
          accumulate(operand, g);
    }

    // One grad_accumulate per parameter, summed over its reads (tied weights).
    llvm::MapVector<StringAttr, Value> paramGrads;
    b.setInsertionPoint(ret);
    for (Operation *op : forwardOps)
      if (auto ref = dyn_cast<ParamRefOp>(op))
        if (Value g = grads.lookup(ref.getResult())) {
          auto [it, inserted] =
              paramGrads.try_emplace(ref.getParamAttr().getAttr(), g);
          if (!inserted)
            it->second = b.create<AddOp>(loc, g.getType(), it->second, g);
        }
    for (auto &[name, g] : paramGrads)
      b.create<GradAccumulateOp>(loc, FlatSymbolRefAttr::get(name), g);

    return split(module, fwd, firstBackward, ret, fwdName, bwdName);
  }

  /// Moves the ops from `firstBackward` to the return into @train_backward,
  /// passing forward values it uses as explicit saved activations.
  LogicalResult split(ModuleOp module, func::FuncOp fwd,
                      Operation *firstBackward, func::ReturnOp ret,
                      StringRef fwdName, StringRef bwdName) {
    Block &body = fwd.getBody().front();
    SmallVector<Operation *> backwardOps;
    for (Operation *op = firstBackward; op != ret; op = op->getNextNode())
      backwardOps.push_back(op);
    llvm::DenseSet<Operation *> inBackward(backwardOps.begin(),
                                           backwardOps.end());

    llvm::SetVector<Value> saved;
    llvm::SetVector<Operation *> remat;
    // Operands first, so clones come in dependency order.
    std::function<void(Operation *)> addRemat = [&](Operation *def) {
      if (remat.contains(def))
        return;
      for (Value o : def->getOperands())
        if (Operation *d = o.getDefiningOp())
          addRemat(d);
      remat.insert(def);
    };
    // A forward value the backward reads is saved, or re-created there:
    // parameter reads and constants (isRematerializable), and broadcasts,
    // from their saved (smaller) operand. A saved broadcast would be
    // materialized at its full size (a norm's row factor: a [B, T, C]
    // copy of a [B, T, 1] value); re-created, a fused region of the
    // backward loads through it.
    auto keep = [&](Value v) {
      Operation *def = v.getDefiningOp();
      if (isRematerializable(def))
        addRemat(def);
      else
        saved.insert(v);
    };
    for (Operation *op : backwardOps)
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && inBackward.contains(def))
          continue;
        if (isa_and_nonnull<BroadcastOp>(def)) {
          keep(def->getOperand(0));
          remat.insert(def);
          continue;
        }
        keep(v);
      }

    OpBuilder b(module.getBody(), module.getBody()->end());
    MLIRContext *ctx = &getContext();
    SmallVector<Type> savedTypes;
    for (Value v : saved)
      savedTypes.push_back(v.getType());
    auto bwd = b.create<func::FuncOp>(fwd.getLoc(), bwdName,
                                      FunctionType::get(ctx, savedTypes, {}));
    bwd->setAttr("mapp.phase", StringAttr::get(ctx, "backward"));
    for (StringRef attr : {"mapp.stage", "mapp.chunk"})
      if (Attribute a = fwd->getAttr(attr))
        bwd->setAttr(attr, a);
    Block *bwdBody = bwd.addEntryBlock();
    IRMapping map;
    for (auto [v, arg] : llvm::zip(saved, bwdBody->getArguments()))
      map.map(v, arg);
    b.setInsertionPointToStart(bwdBody);
    for (Operation *op : remat)
      b.clone(*op, map);
    for (Operation *op : backwardOps)
      b.clone(*op, map);
    b.create<func::ReturnOp>(ret.getLoc());

    // The forward returns the loss and the saved activations.
    for (Operation *op : llvm::reverse(backwardOps))
      op->erase();
    SmallVector<Value> results(ret.getOperands());
    results.append(saved.begin(), saved.end());
    OpBuilder rb(ret);
    rb.create<func::ReturnOp>(ret.getLoc(), results);
    ret.erase();
    SmallVector<Type> resultTypes;
    for (Value v : results)
      resultTypes.push_back(v.getType());
    fwd.setType(FunctionType::get(ctx, body.getArgumentTypes(), resultTypes));
    fwd.setSymName(fwdName);
    fwd->setAttr("mapp.phase", StringAttr::get(ctx, "forward"));
    return concatSliceGrads ? sumSliceGradsAsConcat(bwd) : success();
  }

  /// Rewrites the backward's sums of disjoint slice gradients into concats
  /// (AddOp's canonicalization); touches no other op.
  LogicalResult sumSliceGradsAsConcat(func::FuncOp bwd) {
    RewritePatternSet patterns(&getContext());
    AddOp::getCanonicalizationPatterns(patterns, &getContext());
    SmallVector<Operation *> adds;
    bwd.walk([&](AddOp op) { adds.push_back(op); });
    GreedyRewriteConfig config;
    config.strictMode = GreedyRewriteStrictness::ExistingAndNewOps;
    if (failed(applyOpPatternsAndFold(adds, std::move(patterns), config)))
      return bwd.emitError("mapp-autodiff: summing slice gradients did not "
                           "converge");
    return success();
  }
};

} // namespace

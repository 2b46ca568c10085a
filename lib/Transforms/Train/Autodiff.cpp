// --mapp-autodiff: reverse-mode gradients, split into an explicit forward and
// backward function with the saved activations in their signatures.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPAUTODIFF
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// Values cheaper to recompute in the backward than to keep alive.
bool isRematerializable(Operation *op) {
  return op && (isa<ParamRefOp, FillOp>(op));
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
    if (failed(differentiate(module, fwd)))
      return signalPassFailure();
  }

  LogicalResult differentiate(ModuleOp module, func::FuncOp fwd) {
    Block &body = fwd.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Value loss = ret.getOperand(0);

    // Values on a path from a parameter to the loss need gradients.
    llvm::DenseSet<Value> active;
    for (Operation &op : body.without_terminator()) {
      bool fromParam = isa<ParamRefOp>(op) ||
                       llvm::any_of(op.getOperands(), [&](Value v) {
                         return active.contains(v);
                       });
      if (fromParam)
        for (Value r : op.getResults())
          active.insert(r);
    }
    if (!active.contains(loss))
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
    auto seed = b.create<FillOp>(loc, loss.getType(),
                                 b.getF64FloatAttr(lossScale));
    grads[loss] = seed;

    SmallVector<Operation *> forwardOps;
    for (Operation &op : body.without_terminator())
      if (&op != seed)
        forwardOps.push_back(&op);
    for (Operation *op : llvm::reverse(forwardOps)) {
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

    return split(module, fwd, seed, ret);
  }

  /// Moves the ops from `firstBackward` to the return into @train_backward,
  /// passing forward values it uses as explicit saved activations.
  LogicalResult split(ModuleOp module, func::FuncOp fwd,
                      Operation *firstBackward, func::ReturnOp ret) {
    Block &body = fwd.getBody().front();
    SmallVector<Operation *> backwardOps;
    for (Operation *op = firstBackward; op != ret; op = op->getNextNode())
      backwardOps.push_back(op);
    llvm::DenseSet<Operation *> inBackward(backwardOps.begin(),
                                           backwardOps.end());

    llvm::SetVector<Value> saved;
    llvm::SetVector<Operation *> remat;
    for (Operation *op : backwardOps)
      for (Value v : op->getOperands()) {
        Operation *def = v.getDefiningOp();
        if (def && inBackward.contains(def))
          continue;
        if (isRematerializable(def))
          remat.insert(def);
        else
          saved.insert(v);
      }

    OpBuilder b(module.getBody(), module.getBody()->end());
    MLIRContext *ctx = &getContext();
    SmallVector<Type> savedTypes;
    for (Value v : saved)
      savedTypes.push_back(v.getType());
    auto bwd = b.create<func::FuncOp>(fwd.getLoc(), "train_backward",
                                      FunctionType::get(ctx, savedTypes, {}));
    bwd->setAttr("mapp.phase", StringAttr::get(ctx, "backward"));
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
    SmallVector<Value> results{ret.getOperand(0)};
    results.append(saved.begin(), saved.end());
    OpBuilder rb(ret);
    rb.create<func::ReturnOp>(ret.getLoc(), results);
    ret.erase();
    SmallVector<Type> resultTypes;
    for (Value v : results)
      resultTypes.push_back(v.getType());
    fwd.setType(FunctionType::get(ctx, body.getArgumentTypes(), resultTypes));
    fwd.setSymName("train_forward");
    fwd->setAttr("mapp.phase", StringAttr::get(ctx, "forward"));
    return success();
  }
};

} // namespace

// --mapp-split-backward: each backward function becomes a backward-input
// function (mapp.split = "input": everything the previous stage waits for)
// and a backward-weight function (mapp.split = "weight": the parameter
// gradients), for zero-bubble schedules (zb-h1) that run W later.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPSPLITBACKWARD
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

struct SplitBackwardPass
    : mapp::impl::MappSplitBackwardBase<SplitBackwardPass> {
  using Base::Base;

  /// The weight-gradient part of `fn`: grad_accumulate and grad_sync (they
  /// touch only the Grad buffers) and every pure op whose results only they
  /// (transitively) use. Everything else — sends, collectives of the input
  /// gradient, trace marks — stays in the input-gradient part.
  llvm::DenseSet<Operation *> weightOps(func::FuncOp fn) {
    llvm::DenseSet<Operation *> w;
    Block &body = fn.getBody().front();
    for (Operation &op : llvm::reverse(body.without_terminator())) {
      if (isa<GradAccumulateOp, GradSyncOp>(op)) {
        w.insert(&op);
        continue;
      }
      if (!isMemoryEffectFree(&op) || op.getNumResults() == 0)
        continue;
      bool onlyWeight = llvm::all_of(op.getUsers(), [&](Operation *u) {
        return w.contains(u);
      });
      if (onlyWeight && !op.use_empty())
        w.insert(&op);
    }
    return w;
  }

  LogicalResult split(func::FuncOp fn) {
    MLIRContext *ctx = &getContext();
    Block &body = fn.getBody().front();
    llvm::DenseSet<Operation *> w = weightOps(fn);
    // Values W reads that the input part defines (or receives): returned by
    // Bi, the arguments of W.
    llvm::SetVector<Value> crossing;
    for (Operation &op : body.without_terminator())
      if (w.contains(&op))
        for (Value v : op.getOperands()) {
          Operation *def = v.getDefiningOp();
          if (!def || !w.contains(def))
            crossing.insert(v);
        }

    OpBuilder b(fn);
    b.setInsertionPointAfter(fn);
    SmallVector<Type> types;
    for (Value v : crossing)
      types.push_back(v.getType());
    std::string name = (fn.getSymName() + "_weight").str();
    auto wfn = b.create<func::FuncOp>(fn.getLoc(), name,
                                      FunctionType::get(ctx, types, {}));
    for (NamedAttribute a : fn->getAttrs())
      if (a.getName().getValue().starts_with("mapp."))
        wfn->setAttr(a.getName(), a.getValue());
    wfn->setAttr("mapp.split", StringAttr::get(ctx, "weight"));
    Block *wbody = wfn.addEntryBlock();
    IRMapping map;
    for (auto [v, arg] : llvm::zip(crossing, wbody->getArguments()))
      map.map(v, arg);
    b.setInsertionPointToStart(wbody);
    SmallVector<Operation *> moved;
    for (Operation &op : body.without_terminator())
      if (w.contains(&op)) {
        b.clone(op, map);
        moved.push_back(&op);
      }
    b.create<func::ReturnOp>(fn.getLoc());

    auto ret = cast<func::ReturnOp>(body.getTerminator());
    if (ret.getNumOperands() != 0)
      return fn.emitError("mapp-split-backward: a backward returns nothing, "
                          "this one returns ")
             << ret.getNumOperands() << " value(s)";
    for (Operation *op : llvm::reverse(moved))
      op->erase();
    OpBuilder rb(ret);
    rb.create<func::ReturnOp>(ret.getLoc(), crossing.getArrayRef());
    ret.erase();
    fn.setType(FunctionType::get(ctx, body.getArgumentTypes(), types));
    fn->setAttr("mapp.split", StringAttr::get(ctx, "input"));
    return success();
  }

  void runOnOperation() override {
    SmallVector<func::FuncOp> backwards;
    for (auto fn : getOperation().getOps<func::FuncOp>()) {
      auto phase = fn->getAttrOfType<StringAttr>("mapp.phase");
      if (phase && phase.getValue() == "backward" && !fn->hasAttr("mapp.split"))
        backwards.push_back(fn);
    }
    if (backwards.empty()) {
      getOperation().emitError("mapp-split-backward: no unsplit backward "
                               "function (mapp.phase = \"backward\"); run "
                               "--mapp-autodiff first");
      return signalPassFailure();
    }
    for (func::FuncOp fn : backwards)
      if (failed(split(fn)))
        return signalPassFailure();
  }
};

} // namespace

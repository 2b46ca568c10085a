// --mapp-context-parallel: context parallelism on the forward graph, after
// tensor parallelism and before pipeline partitioning and autodiff
// (docs/context-parallel.md).
//
// The sequence S of every row splits into 2·cp chunks; member r of the cp
// group keeps chunks r and 2·cp−1−r (causal load balancing: every member
// has the same attention work). The forward graph becomes that of one
// member's share:
//
//   tokens'  = cp_shard(tokens) {dim = 1}                 [B, S/cp]
//   wpe'     = cp_shard(wpe) {dim = 0}                    [S/cp, H]
//   ... position-local ops on [B, S/cp, ...] ...
//   o        = cp_attention(q, k, v) {comm = ring | a2a}  global positions
//
// The loss is the member's mean over its tokens; the data-parallel pass
// (given dp·cp) averages gradients over dp and cp together, which is the
// gradient of the mean over the whole sequence (equal shares).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPCONTEXTPARALLEL
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

RankedTensorType tensorTy(Value v) {
  return dyn_cast<RankedTensorType>(v.getType());
}

RankedTensorType withDim(RankedTensorType t, int64_t dim, int64_t n) {
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = n;
  return RankedTensorType::get(shape, t.getElementType());
}

struct ContextParallelPass
    : mapp::impl::MappContextParallelBase<ContextParallelPass> {
  using Base::Base;

  int64_t batch = 0, seq = 0;
  llvm::DenseSet<Value> sharded; // values holding this member's share

  InFlightDiagnostic fail(Operation *op, const Twine &msg) {
    return op->emitError("mapp-context-parallel: ") << msg;
  }

  /// A module-level option error.
  LogicalResult check(ModuleOp module) {
    if (cp < 1)
      return module.emitError("mapp-context-parallel: cp must be >= 1, got ")
             << cp.getValue();
    if (failed(checkAtMost(module, "mapp-context-parallel", "cp", cp,
                           kMaxDegree, kMaxDegreeWhy)))
      return failure();
    if (comm != "ring" && comm != "a2a")
      return module.emitError("mapp-context-parallel: cp-comm must be ring or "
                              "a2a, got \"")
             << comm.getValue() << "\"";
    if (int64_t d = dp; d > 0 && d % cp != 0)
      return module.emitError("mapp-context-parallel: cp=")
             << cp.getValue() << " does not divide the data-parallel ranks "
             << d << " (cp lives inside dp: world = tp·pp·dp·cp)";
    return success();
  }

  Value shard(OpBuilder &b, Location loc, Value v, int64_t dim) {
    auto t = tensorTy(v);
    auto s = b.create<CpShardOp>(loc, withDim(t, dim, t.getShape()[dim] / cp),
                                 v, b.getI64IntegerAttr(dim),
                                 b.getI64IntegerAttr(cp), b.getStringAttr("cp"));
    sharded.insert(s.getResult());
    return s.getResult();
  }

  /// dims/perm/dim attributes of `op` that touch the sequence dimension.
  bool mixesPositions(Operation *op) {
    if (isa<DropoutOp>(op))
      return true;
    if (auto s = dyn_cast<SliceOp>(op))
      return s.getDim() == 1;
    if (auto c = dyn_cast<ConcatOp>(op))
      return c.getDim() == 1;
    if (auto t = dyn_cast<TransposeOp>(op))
      return t.getPerm().size() < 2 || t.getPerm()[0] != 0 ||
             t.getPerm()[1] != 1;
    for (StringRef key : {"dims"})
      if (auto a = op->getAttrOfType<DenseI64ArrayAttr>(key))
        if (llvm::is_contained(a.asArrayRef(), 1))
          return true;
    if (auto a = op->getAttrOfType<IntegerAttr>("dim"))
      if (isa<AllGatherOp, ReduceScatterOp, AllToAllOp>(op) && a.getInt() == 1)
        return true;
    return false;
  }

  LogicalResult rewriteAttention(AttentionOp at) {
    if (at.getSoftcapAttr() || at.getSlidingWindowAttr() ||
        (at.getDropoutAttr() && at.getDropout()->convertToDouble() > 0))
      return fail(at, "attention with softcap, sliding_window or dropout is "
                      "not supported with cp > 1");
    int64_t heads = at.getHeads();
    int64_t d = tensorTy(at.getQ()).getShape()[2] / heads;
    int64_t kvHeads = tensorTy(at.getK()).getShape()[2] / d;
    if (comm == "a2a" && (heads % cp || kvHeads % cp))
      return fail(at, "cp-comm=a2a splits the heads over the cp group: ")
             << heads << " heads and " << kvHeads
             << " key/value heads (after tensor parallelism) must be "
                "divisible by cp="
             << cp.getValue();
    OpBuilder b(at);
    auto cpAt = b.create<CpAttentionOp>(
        at.getLoc(), at.getQ().getType(), at.getQ(), at.getK(), at.getV(),
        at.getHeadsAttr(), at.getScaleAttr(), at.getCausalAttr(),
        at.getRotaryAttr(), at.getRotaryBaseAttr(), at.getRotaryDimAttr(),
        b.getI64IntegerAttr(cp), b.getStringAttr(comm), b.getStringAttr("cp"));
    if (auto n = at->getAttrOfType<StringAttr>("mapp.name"))
      cpAt->setAttr("mapp.name", n);
    at.getResult().replaceAllUsesWith(cpAt.getResult());
    sharded.insert(cpAt.getResult());
    at.erase();
    return success();
  }

  /// Narrows op's results to the share; shards position tables it adds.
  LogicalResult rewriteOp(Operation *op) {
    Value shardedIn;
    for (Value v : op->getOperands())
      if (sharded.contains(v))
        shardedIn = v;
    if (!shardedIn)
      return success();
    if (auto at = dyn_cast<AttentionOp>(op))
      return rewriteAttention(at);
    if (mixesPositions(op))
      return fail(op, "'")
             << op->getName()
             << "' mixes sequence positions; context parallelism splits the "
                "sequence (only position-local ops and attention are "
                "supported with cp > 1)";
    // Position tables [S, ...] broadcast onto [B, S, ...] activations.
    if (isa<AddOp, MulOp>(op)) {
      auto act = tensorTy(op->getOperand(0));
      for (OpOperand &o : op->getOpOperands()) {
        auto t = tensorTy(o.get());
        if (sharded.contains(o.get()) || !t || !act)
          continue;
        if (t.getRank() == act.getRank() - 1 && t.getRank() >= 1 &&
            t.getShape()[0] == seq) {
          OpBuilder b(op);
          o.set(shard(b, op->getLoc(), o.get(), 0));
        }
      }
    }
    for (Value r : op->getResults()) {
      auto t = tensorTy(r);
      if (!t)
        continue;
      ArrayRef<int64_t> s = t.getShape();
      if (isa<ReshapeOp>(op)) {
        if (s.size() >= 2 && s[0] == batch && s[1] == seq)
          r.setType(withDim(t, 1, seq / cp));
        else if (!s.empty() && s[0] == batch * seq)
          r.setType(withDim(t, 0, batch * seq / cp));
        else
          return fail(op, "reshape to ")
                 << t << " moves the sequence dimension; context parallelism "
                         "cannot split it";
        sharded.insert(r);
        continue;
      }
      if (s.size() >= 2 && s[0] == batch && s[1] == seq) {
        r.setType(withDim(t, 1, seq / cp));
        sharded.insert(r);
      }
    }
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(check(module)))
      return signalPassFailure();
    if (cp == 1)
      return;
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    if (!fn) {
      module.emitError("mapp-context-parallel: no function @forward (run the "
                       "pass on the forward graph, before autodiff)");
      return signalPassFailure();
    }
    if (hasParallelKey(module, "cp")) {
      module.emitError("mapp-context-parallel: the module is already context "
                       "parallel (mapp.parallel has cp)");
      return signalPassFailure();
    }
    if (getParallelInt(module, "ep", 1) > 1) {
      module.emitError("mapp-context-parallel: cp > 1 with ep > 1 is not "
                       "supported (both live inside dp)");
      return signalPassFailure();
    }
    Block &body = fn.getBody().front();
    if (body.getNumArguments() == 0) {
      fn.emitError("mapp-context-parallel: @forward has no token arguments");
      return signalPassFailure();
    }
    for (BlockArgument arg : body.getArguments()) {
      auto t = tensorTy(arg);
      if (!t || t.getRank() != 2) {
        fn.emitError("mapp-context-parallel: @forward argument #")
            << arg.getArgNumber() << " must be [batch, seq], got "
            << arg.getType();
        return signalPassFailure();
      }
      if (!seq) {
        batch = t.getShape()[0];
        seq = t.getShape()[1];
      }
      if (t.getShape()[1] != seq || t.getShape()[0] != batch) {
        fn.emitError("mapp-context-parallel: @forward arguments differ in "
                     "shape (")
            << arg.getType() << " vs [" << batch << ", " << seq << "]";
        return signalPassFailure();
      }
    }
    if (seq % (2 * cp) != 0) {
      fn.emitError("mapp-context-parallel: sequence length ")
          << seq << " is not divisible by 2·cp = " << 2 * cp
          << " (each rank holds two equal chunks: causal load balancing)";
      return signalPassFailure();
    }
    // Each argument's share is taken before its first use, in the stage
    // that uses it (pipeline stages pass floats only).
    for (BlockArgument arg : body.getArguments()) {
      if (arg.use_empty())
        continue;
      Operation *first = nullptr;
      for (Operation *user : arg.getUsers())
        if (!first || user->isBeforeInBlock(first))
          first = user;
      OpBuilder b(first);
      Value s = shard(b, fn.getLoc(), arg, 1);
      arg.replaceAllUsesExcept(s, s.getDefiningOp());
    }
    SmallVector<Operation *> ops;
    for (Operation &op : body)
      if (!isa<CpShardOp>(op))
        ops.push_back(&op);
    for (Operation *op : ops)
      if (failed(rewriteOp(op)))
        return signalPassFailure();
    setParallelInt(module, "cp", cp);
    setParallelAttr(module, "cp_comm", StringAttr::get(&getContext(), comm));
    // The checked data-parallel ranks (cp inside): passes before
    // --mapp-data-parallel (which records the same) read a whole layout.
    if (dp > 0)
      setParallelInt(module, "dp", dp);
  }
};

} // namespace

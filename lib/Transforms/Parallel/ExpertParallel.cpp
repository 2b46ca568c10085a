// --mapp-expert-parallel: Megatron expert parallelism on the forward graph,
// after tensor parallelism and before pipeline partitioning and autodiff.
//
// One MoE layer (MappMoeOps.td) is recognized by its moe_permute: the
// permuted rows xp [R, H] flow through grouped matmuls (with the
// moe_assign's counts) and row-wise elementwise ops into the y operand of
// one moe_unpermute. The pass cuts that expert computation out of the
// rank's tokens:
//
//   xp           = moe_permute(x, slots)                      [R, H]
//   xd, lcounts  = ep_dispatch(xp, counts) {members = ep}     [C, H], [E/ep]
//   ... grouped matmuls on w [E/ep, K, N] with lcounts ...    [C, *]
//   yp           = ep_combine(yd, counts) {members = ep}      [R, H]
//   y            = moe_unpermute(yp, probs, slots)
//
// Member j of the ep group owns experts [j·E/ep, (j+1)·E/ep); the expert
// weights become parameters sharded along dim 0 over "ep" (rank i of the
// group holds experts [i·E/ep, (i+1)·E/ep) of the full tensor, so fresh
// initialization and --weights slice what one rank would hold). The router,
// aux and z losses stay on the rank's own tokens. The data-parallel pass
// synchronizes the expert gradients over "edp" (docs/expert-parallel.md).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPEXPERTPARALLEL
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

RankedTensorType tensorTy(Value v) {
  return cast<RankedTensorType>(v.getType());
}

RankedTensorType withDim0(RankedTensorType t, int64_t n) {
  SmallVector<int64_t> shape(t.getShape());
  shape[0] = n;
  return RankedTensorType::get(shape, t.getElementType());
}

/// One MoE layer's expert computation.
struct ExpertRegion {
  MoePermuteOp permute;
  MoeAssignOp assign;
  MoeUnpermuteOp unpermute;
  /// Ops between permute and unpermute, in block order.
  SmallVector<Operation *> ops;
  SmallVector<MoeGroupedMatmulOp> matmuls;
};

struct ExpertParallelPass
    : mapp::impl::MappExpertParallelBase<ExpertParallelPass> {
  using Base::Base;

  InFlightDiagnostic fail(Operation *op, const Twine &msg) {
    return op->emitError("mapp-expert-parallel: ") << msg;
  }

  /// Row-wise ops the expert computation may contain besides the grouped
  /// matmuls: each output row depends on the same input row only, so the
  /// ops run alike on dispatched rows (rows past the total stay zero).
  static bool rowWise(Operation *op) {
    if (isa<GeluOp, SiluOp, MulOp, AddOp, ScaleOp>(op))
      return true;
    if (auto s = dyn_cast<SliceOp>(op))
      return s.getDim() != 0;
    if (auto c = dyn_cast<ConcatOp>(op))
      return c.getDim() != 0;
    return false;
  }

  LogicalResult match(MoePermuteOp permute, ExpertRegion &r) {
    r.permute = permute;
    r.assign = permute.getSlots().getDefiningOp<MoeAssignOp>();
    if (!r.assign)
      return fail(permute, "the slots of moe_permute must come from "
                           "mapp.moe_assign");
    Value xp = permute.getResult();
    int64_t rows = tensorTy(xp).getShape()[0];
    Block *block = permute->getBlock();
    // Forward closure of the permuted rows, up to the unpermute's y.
    llvm::SetVector<Operation *> region;
    SmallVector<Value> work{xp};
    while (!work.empty()) {
      Value v = work.pop_back_val();
      for (OpOperand &use : v.getUses()) {
        Operation *user = use.getOwner();
        if (auto u = dyn_cast<MoeUnpermuteOp>(user)) {
          if (use.getOperandNumber() != 0)
            return fail(user, "expert rows reach moe_unpermute as probs or "
                              "slots, not as y");
          if (r.unpermute && r.unpermute != u) {
            auto d = fail(user, "the expert rows of one moe_permute reach "
                                "two moe_unpermute ops");
            d.attachNote(r.unpermute.getLoc()) << "the other one";
            return d;
          }
          r.unpermute = u;
          continue;
        }
        if (user->getBlock() != block)
          return fail(user, "the expert computation must stay in one block");
        if (!region.insert(user))
          continue;
        if (auto mm = dyn_cast<MoeGroupedMatmulOp>(user)) {
          if (use.getOperandNumber() != 0)
            return fail(user, "expert rows used as a grouped matmul's "
                              "weight or counts");
          r.matmuls.push_back(mm);
        } else if (!rowWise(user)) {
          auto d = fail(user, "'")
                   << user->getName()
                   << "' in the expert computation is not supported (expected "
                      "moe_grouped_matmul and row-wise ops: gelu, silu, mul, "
                      "add, scale, slice/concat past dim 0)";
          d.attachNote(permute.getLoc()) << "the MoE layer's moe_permute";
          return d;
        }
        for (Value res : user->getResults()) {
          auto t = dyn_cast<RankedTensorType>(res.getType());
          if (!t || t.getRank() < 1 || t.getShape()[0] != rows)
            return fail(user, "expert-computation result must be [")
                   << rows << ", ...] like the permuted rows, got "
                   << res.getType();
          work.push_back(res);
        }
      }
    }
    if (!r.unpermute)
      return fail(permute, "the permuted rows never reach a moe_unpermute");
    if (r.matmuls.empty())
      return fail(permute, "no moe_grouped_matmul between moe_permute and "
                           "moe_unpermute");
    // Every other operand of a region op is region-internal, or (for the
    // grouped matmuls) the expert weight and the layer's counts.
    for (Operation *op : region) {
      for (OpOperand &o : op->getOpOperands()) {
        Value v = o.get();
        Operation *def = v.getDefiningOp();
        if (v == xp || (def && region.contains(def)))
          continue;
        if (auto mm = dyn_cast<MoeGroupedMatmulOp>(op)) {
          if (o.getOperandNumber() == 2 && v == r.assign.getCounts())
            continue;
          if (o.getOperandNumber() == 1 && v.getDefiningOp<ParamRefOp>())
            continue;
          if (o.getOperandNumber() == 2)
            return fail(op, "grouped matmul counts must be the layer's "
                            "moe_assign counts");
          return fail(op, "grouped matmul weight must be a parameter "
                          "(mapp.param_ref) to shard over ep");
        }
        return fail(op, "operand #")
               << o.getOperandNumber()
               << " comes from outside the expert computation (only the "
                  "permuted rows may enter it)";
      }
    }
    r.ops.assign(region.begin(), region.end());
    llvm::sort(r.ops, [](Operation *a, Operation *b) {
      return a->isBeforeInBlock(b);
    });
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (ep < 1) {
      module.emitError("mapp-expert-parallel: ep must be >= 1, got ")
          << ep.getValue();
      return signalPassFailure();
    }
    if (failed(checkAtMost(module, "mapp-expert-parallel", "ep", ep, kMaxDegree,
                           kMaxDegreeWhy)))
      return signalPassFailure();
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    if (ep == 1)
      return; // every rank holds all experts (the layout keeps ep unset)
    if (!fn) {
      module.emitError("mapp-expert-parallel: no function @forward (run the "
                       "pass on the forward graph, before autodiff)");
      return signalPassFailure();
    }
    if (hasParallelKey(module, "ep")) {
      module.emitError("mapp-expert-parallel: the module is already expert "
                       "parallel (mapp.parallel has ep)");
      return signalPassFailure();
    }
    if (int64_t dpOpt = dp; dpOpt > 0 && dpOpt % ep != 0) {
      module.emitError("mapp-expert-parallel: ep=")
          << ep.getValue() << " does not divide dp=" << dpOpt
          << " (expert parallelism lives inside the data-parallel group)";
      return signalPassFailure();
    }
    SmallVector<MoePermuteOp> permutes;
    fn.walk([&](MoePermuteOp p) { permutes.push_back(p); });
    if (permutes.empty()) {
      fn.emitError("mapp-expert-parallel: ep=")
          << ep.getValue()
          << " but the model has no MoE layer (no mapp.moe_permute in "
             "@forward): set num_moe_experts or leave ep at 1";
      return signalPassFailure();
    }
    // Match and check every layer before rewriting anything.
    SmallVector<ExpertRegion> regions(permutes.size());
    for (auto [p, r] : llvm::zip(permutes, regions))
      if (failed(match(p, r)))
        return signalPassFailure();
    // Which parameters become expert shards, and who uses them.
    llvm::MapVector<StringAttr, Operation *> expertParams;
    llvm::DenseSet<Operation *> expertUsers;
    for (ExpertRegion &r : regions) {
      int64_t e = r.assign.getNumExperts();
      if (e % ep != 0) {
        fail(r.assign, "")
            << e << " experts (num_moe_experts) cannot be split evenly over ep="
            << ep.getValue();
        return signalPassFailure();
      }
      for (MoeGroupedMatmulOp mm : r.matmuls) {
        auto ref = mm.getW().getDefiningOp<ParamRefOp>();
        expertParams.try_emplace(ref.getParamAttr().getAttr(), mm);
        expertUsers.insert(mm);
        if (tensorTy(mm.getW()).getShape()[0] != e) {
          fail(mm, "weight has ")
              << tensorTy(mm.getW()).getShape()[0] << " experts, moe_assign "
              << e;
          return signalPassFailure();
        }
      }
    }
    // An expert weight is used by grouped matmuls of expert computations
    // only (its slice is all a rank holds).
    for (auto &[name, first] : expertParams) {
      auto decl = module.lookupSymbol<ParamOp>(name);
      if (!decl) {
        fail(first, "no mapp.param @") << name.getValue();
        return signalPassFailure();
      }
      if (decl.getShardDimAttr()) {
        fail(decl, "expert weight @")
            << name.getValue() << " is already sharded over "
            << (decl.getShardGroupAttr() ? decl.getShardGroupAttr().getValue()
                                         : StringRef("tp"));
        return signalPassFailure();
      }
      bool bad = false;
      module.walk([&](ParamRefOp ref) {
        if (bad || ref.getParamAttr().getAttr() != name)
          return;
        for (Operation *user : ref->getUsers())
          if (!expertUsers.contains(user)) {
            auto d = fail(user, "expert weight @")
                     << name.getValue()
                     << " is used outside a grouped matmul of an expert "
                        "computation (ep shards it)";
            d.attachNote(first->getLoc()) << "expert use";
            bad = true;
            return;
          }
      });
      if (bad)
        return signalPassFailure();
    }

    for (ExpertRegion &r : regions)
      rewrite(r);
    for (auto &[name, first] : expertParams) {
      auto decl = module.lookupSymbol<ParamOp>(name);
      auto t = decl.getType();
      auto sharded = withDim0(cast<RankedTensorType>(t), t.getShape()[0] / ep);
      decl.setType(sharded);
      OpBuilder b(decl);
      decl.setShardDimAttr(b.getI64IntegerAttr(0));
      decl.setShardGroupAttr(b.getStringAttr("ep"));
      module.walk([&](ParamRefOp ref) {
        if (ref.getParamAttr().getAttr() == name)
          ref.getResult().setType(sharded);
      });
    }
    setParallelInt(module, "ep", ep);
  }

  /// Rows a rank's experts may receive: every member's whole buffer
  /// (dropless, ep·R), at most `capacity` rows per expert and member with
  /// capacity drops (E·capacity in all).
  int64_t capacityRows(ExpertRegion &r, int64_t rows) {
    int64_t c = ep * rows;
    if (auto cap = r.assign.getCapacityAttr())
      c = std::min<int64_t>(c, (int64_t)r.assign.getNumExperts() * cap.getInt());
    return std::max<int64_t>(c, 1);
  }

  void rewrite(ExpertRegion &r) {
    Value xp = r.permute.getResult();
    Value counts = r.assign.getCounts();
    int64_t rows = tensorTy(xp).getShape()[0];
    int64_t e = r.assign.getNumExperts();
    int64_t c = capacityRows(r, rows);
    OpBuilder b(r.permute);
    b.setInsertionPointAfter(r.permute);
    auto i32 = b.getI32Type();
    auto dispatch = b.create<EpDispatchOp>(
        r.permute.getLoc(), withDim0(tensorTy(xp), c),
        RankedTensorType::get({e / ep}, i32), xp, counts,
        b.getI64IntegerAttr(ep), b.getStringAttr("ep"), DenseI64ArrayAttr());
    if (auto n = r.permute->getAttrOfType<StringAttr>("mapp.name")) {
      StringRef layer = n.getValue();
      layer.consume_back(".moe_permute");
      dispatch->setAttr("mapp.name", b.getStringAttr(layer + ".ep_dispatch"));
    }
    xp.replaceUsesWithIf(dispatch.getY(), [&](OpOperand &o) {
      return o.getOwner() != dispatch;
    });
    for (Operation *op : r.ops) {
      for (Value res : op->getResults())
        res.setType(withDim0(tensorTy(res), c));
      if (auto mm = dyn_cast<MoeGroupedMatmulOp>(op))
        mm.getCountsMutable().assign(dispatch.getLocalCounts());
    }
    Value yd = r.unpermute.getY();
    b.setInsertionPoint(r.unpermute);
    auto combine = b.create<EpCombineOp>(
        r.unpermute.getLoc(), withDim0(tensorTy(yd), rows), yd, counts,
        b.getI64IntegerAttr(ep), b.getStringAttr("ep"), DenseI64ArrayAttr());
    if (auto n = r.unpermute->getAttrOfType<StringAttr>("mapp.name")) {
      StringRef layer = n.getValue();
      layer.consume_back(".moe_unpermute");
      combine->setAttr("mapp.name", b.getStringAttr(layer + ".ep_combine"));
    }
    r.unpermute.getYMutable().assign(combine.getX());
  }
};

} // namespace

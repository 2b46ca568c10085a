// MegaFBD transfer=activations between tensor-parallel degrees (Reshard.h).
#include "Reshard.h"

#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace mapp;
using namespace mapp::fbd;

namespace {

std::optional<ValueKey> keyOf(Value v) {
  auto r = dyn_cast<OpResult>(v);
  if (!r)
    return std::nullopt;
  Operation *op = r.getOwner();
  return ValueKey{op->getLoc().getAsOpaquePointer(),
                  op->getName().getAsOpaquePointer(), r.getResultNumber()};
}

/// One side's keyed values; a key seen twice (a pass made two ops of one
/// source op, e.g. the all-reduces of vocab-parallel cross-entropy) is
/// ambiguous and never travels.
struct SideIndex {
  llvm::DenseMap<ValueKey, Value> byKey;
  llvm::DenseSet<ValueKey> ambiguous;
  /// Blocks of the tp-sharded axis: a fused projection (qkv, gate/up)
  /// holds its shard as `shard_blocks` interleaved blocks, not one slice.
  llvm::DenseMap<Value, int64_t> blocks;

  explicit SideIndex(func::FuncOp fn) {
    auto module = fn->getParentOfType<ModuleOp>();
    fn.walk([&](Operation *op) {
      for (Value r : op->getResults()) {
        ValueKey k = *keyOf(r);
        if (!byKey.try_emplace(k, r).second)
          ambiguous.insert(k);
      }
      int64_t b = 1;
      for (Value x : op->getOperands())
        b = std::max(b, blocksOf(x));
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        auto p = module.lookupSymbol<ParamOp>(ref.getParamAttr().getAttr());
        if (auto sb = p ? p->getAttrOfType<IntegerAttr>("shard_blocks")
                        : IntegerAttr())
          b = std::max<int64_t>(b, sb.getInt());
      }
      if (auto s = dyn_cast<SliceOp>(op); s && b > 1) {
        // One whole block of a blocked tensor is a contiguous shard.
        auto in = cast<RankedTensorType>(s.getX().getType());
        int64_t w = s.getEnd() - s.getStart();
        if (w > 0 && w * b == in.getDimSize(s.getDim()) &&
            s.getStart() % w == 0)
          b = 1;
      }
      if (b > 1)
        for (Value r : op->getResults())
          blocks[r] = b;
    });
  }

  int64_t blocksOf(Value v) const {
    auto it = blocks.find(v);
    return it == blocks.end() ? 1 : it->second;
  }

  /// A tp partial sum is not the source value: only its all-reduce is.
  static bool partial(Value v) {
    return llvm::any_of(v.getUsers(), [](Operation *u) {
      return isa<AllReduceOp, ReduceScatterOp>(u);
    });
  }

  Value usable(const ValueKey &k) const {
    if (ambiguous.contains(k))
      return {};
    Value v = byKey.lookup(k);
    if (!v || partial(v) || blocksOf(v) > 1)
      return {};
    return v;
  }
};

/// How a source value of global extent N along `axis` is held: the
/// forward side cuts it into a1 ∈ {1, T1} pieces, the backward into a2 ∈
/// {1, T2}; axis = -1 when both replicate it.
struct Layout {
  int64_t axis = -1, n = 1, a1 = 1, a2 = 1;
};

std::optional<Layout> layoutOf(Type global, Type t1, Type t2, int64_t T1,
                               int64_t T2) {
  auto g = dyn_cast<RankedTensorType>(global);
  auto l1 = dyn_cast<RankedTensorType>(t1);
  auto l2 = dyn_cast<RankedTensorType>(t2);
  if (!g || !l1 || !l2 || !isa<FloatType>(l2.getElementType()) ||
      g.getRank() != l1.getRank() || g.getRank() != l2.getRank() ||
      l1.getElementType() != l2.getElementType() || !g.hasStaticShape() ||
      !l1.hasStaticShape() || !l2.hasStaticShape())
    return std::nullopt;
  Layout out;
  for (int64_t d = 0; d < g.getRank(); ++d) {
    int64_t n = g.getDimSize(d), e1 = l1.getDimSize(d), e2 = l2.getDimSize(d);
    if (e1 == n && e2 == n)
      continue;
    if (e1 <= 0 || e2 <= 0 || n % e1 || n % e2 || out.axis >= 0)
      return std::nullopt;
    int64_t a1 = n / e1, a2 = n / e2;
    if ((a1 != 1 && a1 != T1) || (a2 != 1 && a2 != T2))
      return std::nullopt;
    out = {d, n, a1, a2};
  }
  return out;
}

Type withDim(Type t, int64_t axis, int64_t extent) {
  auto r = cast<RankedTensorType>(t);
  SmallVector<int64_t> shape(r.getShape());
  shape[axis] = extent;
  return RankedTensorType::get(shape, r.getElementType());
}

} // namespace

void mapp::fbd::collectGlobalTypes(ModuleOp source, GlobalTypes &out) {
  source.walk([&](Operation *op) {
    for (Value r : op->getResults())
      out.try_emplace(*keyOf(r), r.getType());
  });
}

LogicalResult mapp::fbd::reshardActivations(func::FuncOp fwd,
                                            func::FuncOp bwdFwd,
                                            const GlobalTypes &global,
                                            const ReshardOptions &o,
                                            int64_t &numTransfers) {
  const int64_t T1 = o.fwdTp, T2 = o.bwdTp;
  SideIndex side1(fwd), side2(bwdFwd);
  Block &body = bwdFwd.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());

  // What travels: the values nearest the backward's reads that both sides
  // hold as the same source value; the ops between them and the reads stay
  // (recomputed on the backward side).
  llvm::DenseMap<Value, std::pair<Value, Layout>> travels; // bwd → fwd value
  llvm::DenseSet<Operation *> keep{ret};
  llvm::SmallVector<Value> work(ret.getOperands());
  llvm::DenseSet<Value> seen;
  while (!work.empty()) {
    Value v = work.pop_back_val();
    if (isa<BlockArgument>(v) || !seen.insert(v).second)
      continue;
    std::optional<ValueKey> k = keyOf(v);
    Value u = side2.usable(*k) ? side1.usable(*k) : Value();
    auto g = u ? global.find(*k) : global.end();
    if (g != global.end())
      if (auto l = layoutOf(g->second, u.getType(), v.getType(), T1, T2)) {
        travels[v] = {u, *l};
        continue;
      }
    Operation *op = v.getDefiningOp();
    // A stage input (the pipeline's recv, no op of the forward graph) is
    // replicated over tp on both sides.
    if (u && isa<RecvOp>(op) && isa<RecvOp>(u.getDefiningOp()) &&
        u.getType() == v.getType()) {
      travels[v] = {u, Layout{}};
      continue;
    }
    if (isa<RecvOp>(op))
      return op->emitError("mapp-split-fwd-bwd: transfer=activations at "
                           "fwd-tp=")
             << T1 << ", bwd-tp=" << T2
             << ": the backward side reads this stage input, which the "
                "forward side does not hold in a matching layout";
    keep.insert(op);
    for (Value x : op->getOperands())
      work.push_back(x);
  }

  // In the backward block's order, so both sides number them alike.
  SmallVector<Value> order;
  for (Operation &op : body)
    for (Value r : op.getResults())
      if (travels.count(r))
        order.push_back(r);

  MLIRContext *ctx = bwdFwd.getContext();
  Builder attrs(ctx);
  OpBuilder into = OpBuilder::atBlockBegin(&body);
  llvm::DenseSet<Operation *> added;
  for (auto [i, v] : llvm::enumerate(order)) {
    auto [u, l] = travels[v];
    int64_t tag = o.tagBase + int64_t(i);
    int64_t e1 = l.n / l.a1, e2 = l.n / l.a2;
    // Backward rank t holds range r2(t) of extent e2 along the axis.
    auto r2 = [&](int64_t t) { return l.a2 > 1 ? t : 0; };
    int64_t pieces = l.axis >= 0 && e2 > e1 ? e2 / e1 : 1;
    Operation *def = u.getDefiningOp();
    OpBuilder from(def->getBlock(), std::next(def->getIterator()));
    Location loc = def->getLoc();
    auto mark = [&](Operation *op, int64_t j) {
      op->setAttr("fbd_cross", attrs.getStringAttr("bwd"));
      op->setAttr("fbd_from", attrs.getI64IntegerAttr(j));
    };
    auto send = [&](Value x, int64_t j, int64_t t) {
      auto s = from.create<SendOp>(loc, x, attrs.getI64IntegerAttr(o.stage),
                                   attrs.getI64IntegerAttr(tag));
      mark(s, j);
      s->setAttr("fbd_to", attrs.getI64IntegerAttr(t));
    };
    SmallVector<Value> got;
    if (pieces == 1) {
      // One forward rank holds backward rank t's whole range: it sends
      // that slice of its piece (the whole piece when the ranges agree).
      SmallVector<int64_t> src;
      llvm::DenseMap<std::pair<int64_t, int64_t>, Value> slices;
      for (int64_t t = 0; t < T2; ++t) {
        int64_t lo = l.axis >= 0 ? r2(t) * e2 : 0;
        int64_t r1 = l.axis >= 0 ? lo / e1 : 0;
        int64_t j = l.a1 > 1 ? r1 : t % T1;
        int64_t off = lo - (l.a1 > 1 ? r1 * e1 : 0);
        Value x = u;
        if (l.axis >= 0 && e2 < e1) {
          Value &cached = slices[{j, off}];
          if (!cached) {
            auto s = from.create<SliceOp>(
                loc, withDim(u.getType(), l.axis, e2), u,
                attrs.getI64IntegerAttr(l.axis), attrs.getI64IntegerAttr(off),
                attrs.getI64IntegerAttr(off + e2));
            mark(s, j);
            cached = s;
          }
          x = cached;
        }
        send(x, j, t);
        src.push_back(j);
      }
      auto r = into.create<RecvOp>(v.getLoc(), v.getType(),
                                   attrs.getI64IntegerAttr(o.stage),
                                   attrs.getI64IntegerAttr(tag));
      r->setAttr("fbd_cross", attrs.getStringAttr("fwd"));
      r->setAttr("fbd_src", DenseI64ArrayAttr::get(ctx, src));
      added.insert(r);
      got.push_back(r);
    } else {
      // Backward rank t's range spans `pieces` forward pieces, whole.
      for (int64_t p = 0; p < pieces; ++p) {
        SmallVector<int64_t> src;
        for (int64_t t = 0; t < T2; ++t)
          src.push_back(r2(t) * pieces + p);
        auto r = into.create<RecvOp>(v.getLoc(), u.getType(),
                                     attrs.getI64IntegerAttr(o.stage),
                                     attrs.getI64IntegerAttr(tag));
        r->setAttr("fbd_cross", attrs.getStringAttr("fwd"));
        r->setAttr("fbd_src", DenseI64ArrayAttr::get(ctx, src));
        added.insert(r);
        got.push_back(r);
      }
      for (int64_t t = 0; t < T2; ++t)
        for (int64_t p = 0; p < pieces; ++p)
          send(u, r2(t) * pieces + p, t);
    }
    Value now = got.front();
    if (got.size() > 1) {
      auto c = into.create<ConcatOp>(v.getLoc(), v.getType(), got,
                                     attrs.getI64IntegerAttr(l.axis));
      added.insert(c);
      now = c;
    }
    v.replaceAllUsesWith(now);
  }
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
    if (!keep.contains(&op) && !added.contains(&op)) {
      op.dropAllUses();
      op.erase();
    }
  numTransfers = int64_t(order.size());
  return success();
}

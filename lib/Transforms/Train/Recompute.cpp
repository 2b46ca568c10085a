// --mapp-recompute: activation recomputation as an IR rewrite of the
// forward/backward pairs --mapp-autodiff made. Saved activations the policy
// drops leave the forward's results and the backward's arguments; the
// backward clones the forward ops that produced them right before their
// first use (so one layer's recomputed values live only while that layer's
// backward runs), from values that stay saved.
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Analysis/StepStructure.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"

#include <optional>
#include <set>

namespace mapp {
#define GEN_PASS_DEF_MAPPRECOMPUTE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// The block an op belongs to (LayerNames: "transformer.h.3.mlp.c_fc" ->
/// 3 under the module's "transformer.h.") and the rest of its name
/// ("mlp.c_fc").
struct LayerOf {
  int64_t index;
  StringRef rest;
};

std::optional<LayerOf> layerOf(Operation *op, const LayerNames &names) {
  std::optional<unsigned> l = names.layerOf(op);
  if (!l)
    return std::nullopt;
  return LayerOf{*l, names.rest(op->getAttrOfType<StringAttr>("mapp.name"))};
}

/// Values the backward re-creates anyway (autodiff's rule): parameter reads,
/// constants and tensor-parallel markers on them.
bool isRematerializable(Operation *op) {
  if (op && isa<CopyToGroupOp, ScatterToGroupOp>(op))
    return isRematerializable(op->getOperand(0).getDefiningOp());
  return op && isa<ParamRefOp, FillOp>(op);
}

/// The module path of a name's op within its layer: "attn" of
/// "attn.attention", "" of "attention".
StringRef scopeOf(StringRef rest) {
  size_t dot = rest.rfind('.');
  return dot == StringRef::npos ? StringRef() : rest.take_front(dot);
}

/// The attention core of selective recompute: the fused attention or a
/// softmax, and the pieces of an unfused attention (products, scale, mask
/// dropout, layout) in the module path of one (`attentionScopes`: the
/// model's own, "attn" in the importers', "self_attn", or the block itself).
bool isAttentionCore(Operation *op, StringRef rest,
                     const std::set<std::string> &attentionScopes) {
  if (isa<AttentionOp, SoftmaxOp>(op))
    return true;
  if (!isa<MatmulOp, DropoutOp, ScaleOp, TransposeOp, ReshapeOp>(op))
    return false;
  StringRef scope = scopeOf(rest);
  return llvm::any_of(attentionScopes, [&](const std::string &a) {
    return a.empty() ? scope.empty()
                     : scope == a || scope.starts_with(a + ".");
  });
}

/// The elementwise activation functions of `activations` recompute: one
/// pass over a pre-activation the backward keeps anyway (its gradient reads
/// it), for the widest tensor of an MLP (PyTorch's min-cut partitioner
/// makes the same trade).
bool isActivation(Operation *op) { return isa<GeluOp, SiluOp>(op); }

enum class Policy { None, Selective, Full, Activations };

struct Selection {
  bool all = false;
  std::set<int64_t> layers;
  bool contains(int64_t l) const { return all || layers.count(l); }
};

/// "all" | "0,1" | "0-3,6".
FailureOr<Selection> parseLayers(StringRef spec, ModuleOp module) {
  Selection s;
  spec = spec.trim();
  if (spec == "all") {
    s.all = true;
    return s;
  }
  SmallVector<StringRef> items;
  spec.split(items, ',');
  for (StringRef item : items) {
    item = item.trim();
    auto [lo, hi] = item.split('-');
    int64_t a, b;
    bool range = item.contains('-');
    if (lo.getAsInteger(10, a) || a < 0 ||
        (range && (hi.getAsInteger(10, b) || b < a)))
      return module.emitError("mapp-recompute: layers='")
             << spec << "': '" << item
             << "' is not a layer index or range (all | 0,1 | 0-3,6)";
    if (!range)
      b = a;
    for (int64_t l = a; l <= b; ++l)
      s.layers.insert(l);
  }
  return s;
}

struct Counts {
  int64_t dropped = 0, added = 0;
  uint64_t droppedBytes = 0, addedBytes = 0;
};

uint64_t bytesOf(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  if (!t || !t.hasStaticShape())
    return 0;
  return t.getNumElements() * ((t.getElementTypeBitWidth() + 7) / 8);
}

struct RecomputePass : mapp::impl::MappRecomputeBase<RecomputePass> {
  using Base::Base;

  Policy kind = Policy::None;
  Selection selection;
  LayerNames names{""};

  /// Every forward op's layer: from its mapp.name, or, for the ops passes
  /// add without one (tensor parallelism's copy_to_group, all_reduce and
  /// row-parallel partial linears), the layer of its first operand that has
  /// one.
  llvm::DenseMap<Operation *, int64_t> layersOf(func::FuncOp fwd) {
    llvm::DenseMap<Operation *, int64_t> layer;
    for (Operation &op : fwd.getBody().front().without_terminator()) {
      if (op.hasAttr("mapp.name")) {
        if (std::optional<LayerOf> l = layerOf(&op, names))
          layer[&op] = l->index;
        continue;
      }
      for (Value o : op.getOperands())
        if (Operation *def = o.getDefiningOp())
          if (auto it = layer.find(def); it != layer.end()) {
            layer[&op] = it->second;
            break;
          }
    }
    return layer;
  }

  /// op -> its layer, for the ops the policy may recompute.
  llvm::DenseMap<Operation *, int64_t>
  regionOf(func::FuncOp fwd,
           const llvm::DenseMap<Operation *, int64_t> &layer) {
    llvm::DenseMap<Operation *, int64_t> region;
    std::set<std::string> attentionScopes;
    for (Operation &op : fwd.getBody().front().without_terminator())
      if (isa<AttentionOp, SoftmaxOp>(op))
        if (std::optional<LayerOf> l = layerOf(&op, names))
          attentionScopes.insert(scopeOf(l->rest).str());
    for (Operation &op : fwd.getBody().front().without_terminator()) {
      auto it = layer.find(&op);
      if (it == layer.end() || !selection.contains(it->second) ||
          !isMemoryEffectFree(&op) || isRematerializable(&op) ||
          op.getNumRegions())
        continue;
      if (kind == Policy::Full) {
        region[&op] = it->second;
        continue;
      }
      if (kind == Policy::Activations) {
        if (isActivation(&op))
          region[&op] = it->second;
        continue;
      }
      std::optional<LayerOf> l = layerOf(&op, names);
      if (l && isAttentionCore(&op, l->rest, attentionScopes))
        region[&op] = it->second;
    }
    return region;
  }

  /// Rewrites one forward/backward pair.
  LogicalResult rewrite(func::FuncOp fwd, func::FuncOp bwd, bool hasLoss,
                        Counts &counts) {
    Block &fbody = fwd.getBody().front();
    auto ret = cast<func::ReturnOp>(fbody.getTerminator());
    unsigned lead = hasLoss ? 1 : 0;
    SmallVector<Value> saved(ret.getOperands().drop_front(lead));
    if (saved.size() != bwd.getNumArguments())
      return bwd.emitError("mapp-recompute: @")
             << bwd.getSymName() << " takes " << bwd.getNumArguments()
             << " arguments, @" << fwd.getSymName() << " saves "
             << saved.size();
    llvm::DenseMap<Operation *, int64_t> layer = layersOf(fwd);
    llvm::DenseMap<Operation *, int64_t> region = regionOf(fwd, layer);

    // Candidates: saved values made in the region. Under `full`, a layer's
    // outputs (values read by another layer or outside any layer) stay
    // saved: they are the next layer's input, and recomputing them would
    // chain one layer's recomputation into the previous one's.
    llvm::SetVector<Value> dropped;
    for (Value v : saved) {
      Operation *def = v.getDefiningOp();
      auto it = def ? region.find(def) : region.end();
      if (it == region.end())
        continue;
      bool output =
          kind == Policy::Full && llvm::any_of(v.getUsers(), [&](Operation *u) {
            if (isa<func::ReturnOp>(u))
              return false;
            auto l = layer.find(u);
            return l == layer.end() || l->second != it->second;
          });
      if (!output)
        dropped.insert(v);
    }

    // Boundary: what the recomputation reads that it does not recompute
    // (values outside the dropped value's layer region, arguments). A
    // dropped value that another's recomputation needs as a boundary stays
    // saved; repeat until nothing changes.
    llvm::SetVector<Value> boundary;
    while (true) {
      llvm::DenseSet<Value> keep(saved.begin(), saved.end());
      for (Value d : dropped)
        keep.erase(d);
      boundary.clear();
      llvm::DenseSet<Value> seen;
      std::function<void(Value, int64_t)> walk = [&](Value v, int64_t layer) {
        if (keep.contains(v))
          return;
        Operation *def = v.getDefiningOp();
        if (def && isRematerializable(def))
          return;
        auto it = def ? region.find(def) : region.end();
        if (it == region.end() || it->second != layer) {
          boundary.insert(v);
          return;
        }
        // Interior values belong to one layer, so one visit is enough.
        if (!seen.insert(v).second)
          return;
        for (Value o : def->getOperands())
          walk(o, layer);
      };
      for (Value d : dropped)
        walk(d, region.lookup(d.getDefiningOp()));
      llvm::SetVector<Value> next;
      for (Value d : dropped)
        if (!boundary.contains(d))
          next.insert(d);
      if (next.size() == dropped.size())
        break;
      dropped = std::move(next);
    }
    if (dropped.empty())
      return success();

    // New saved list: the kept values in their order, then the boundary
    // values that were not saved, in forward order (arguments first).
    llvm::SetVector<Value> added;
    llvm::DenseSet<Value> savedSet(saved.begin(), saved.end());
    for (BlockArgument a : fbody.getArguments())
      if (boundary.contains(a) && !savedSet.contains(a))
        added.insert(a);
    for (Operation &op : fbody.without_terminator())
      for (Value r : op.getResults())
        if (boundary.contains(r) && !savedSet.contains(r))
          added.insert(r);

    // The backward: new arguments for the added values; dropped arguments
    // replaced by clones of their producers, placed before the first use.
    Block &bbody = bwd.getBody().front();
    IRMapping map;
    for (auto [v, arg] : llvm::zip(saved, bbody.getArguments()))
      if (!dropped.contains(v))
        map.map(v, arg);
    for (Value v : added) {
      bwd.insertArgument(bwd.getNumArguments(), v.getType(), {}, v.getLoc());
      map.map(v, bbody.getArguments().back());
    }
    OpBuilder b(&getContext());
    std::function<Value(Value)> materialize = [&](Value v) -> Value {
      if (Value m = map.lookupOrNull(v))
        return m;
      Operation *def = v.getDefiningOp();
      for (Value o : def->getOperands())
        materialize(o);
      Operation *clone = b.clone(*def, map);
      if (auto name = def->getAttrOfType<StringAttr>("mapp.name"))
        clone->setAttr("mapp.name",
                       b.getStringAttr(name.getValue() + ".recompute"));
      return map.lookup(v);
    };
    llvm::BitVector erase(bwd.getNumArguments());
    llvm::DenseMap<Value, Value> argOf;
    for (auto [i, v] : llvm::enumerate(saved))
      if (dropped.contains(v)) {
        erase.set(i);
        argOf[bbody.getArgument(i)] = v;
      }
    SmallVector<Operation *> ops;
    for (Operation &op : bbody)
      ops.push_back(&op);
    for (Operation *op : ops)
      for (OpOperand &use : op->getOpOperands()) {
        auto it = argOf.find(use.get());
        if (it == argOf.end())
          continue;
        b.setInsertionPoint(op);
        Value v = materialize(it->second);
        use.get().replaceAllUsesWith(v);
        argOf.erase(it);
      }
    bwd.eraseArguments(erase);

    // The forward returns the new saved list.
    SmallVector<Value> results(ret.getOperands().take_front(lead));
    for (Value v : saved)
      if (!dropped.contains(v))
        results.push_back(v);
    results.append(added.begin(), added.end());
    OpBuilder rb(ret);
    rb.create<func::ReturnOp>(ret.getLoc(), results);
    ret.erase();
    SmallVector<Type> types;
    for (Value v : results)
      types.push_back(v.getType());
    fwd.setType(
        FunctionType::get(&getContext(), fbody.getArgumentTypes(), types));

    counts.dropped += dropped.size();
    counts.added += added.size();
    for (Value v : dropped)
      counts.droppedBytes += bytesOf(v);
    for (Value v : added)
      counts.addedBytes += bytesOf(v);
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (policy == "none")
      return;
    if (policy == "selective")
      kind = Policy::Selective;
    else if (policy == "full")
      kind = Policy::Full;
    else if (policy == "activations")
      kind = Policy::Activations;
    else {
      module.emitError("mapp-recompute: policy must be selective, full, "
                       "activations or none, got '")
          << policy << "'";
      return signalPassFailure();
    }
    FailureOr<Selection> sel = parseLayers(layers, module);
    if (failed(sel))
      return signalPassFailure();
    selection = *sel;
    names = LayerNames::of(module);
    if (module->hasAttr("mapp.recompute")) {
      module.emitError("mapp-recompute: module is already rewritten "
                       "(mapp.recompute is set)");
      return signalPassFailure();
    }

    FailureOr<StepStructure> step = StepStructure::analyze(module);
    if (failed(step))
      return signalPassFailure();
    std::set<int64_t> present;
    SmallVector<std::pair<const StepBlock *, const StepBlock *>> pairs;
    for (const StepBlock &blk : step->blocks) {
      if (blk.phase == Phase::BackwardInput ||
          blk.phase == Phase::BackwardWeight) {
        blk.func.emitError("mapp-recompute: the backward is split into "
                           "input and weight parts; run --mapp-recompute "
                           "before --mapp-split-backward");
        return signalPassFailure();
      }
      if (blk.phase == Phase::Forward)
        blk.func.walk([&](Operation *op) {
          if (std::optional<LayerOf> l = layerOf(op, names))
            present.insert(l->index);
        });
      if (blk.phase == Phase::Backward)
        pairs.push_back({step->producerOf(blk), &blk});
    }
    if (pairs.empty()) {
      module.emitError("mapp-recompute: no forward/backward pair; run "
                       "--mapp-autodiff first");
      return signalPassFailure();
    }
    for (int64_t l : selection.layers)
      if (!present.count(l)) {
        std::string have;
        for (int64_t p : present)
          have += (have.empty() ? "" : ",") + std::to_string(p);
        module.emitError("mapp-recompute: layers=")
            << layers << ": the model has no layer " << l
            << " (layers: " << (have.empty() ? std::string("none") : have)
            << ")";
        return signalPassFailure();
      }

    Counts counts;
    for (auto [fwd, bwd] : pairs)
      if (failed(rewrite(fwd->func, bwd->func, fwd->hasLoss, counts)))
        return signalPassFailure();
    if (counts.dropped == 0) {
      module.emitError("mapp-recompute: policy=")
          << policy << " layers=" << layers << " drops no saved activation (no "
          << (kind == Policy::Full          ? "layer ops"
              : kind == Policy::Activations ? "activation function outputs"
                                            : "attention core")
          << " among the saved values)";
      return signalPassFailure();
    }
    Builder b(&getContext());
    module->setAttr(
        "mapp.recompute",
        b.getDictionaryAttr({
            b.getNamedAttr("policy", b.getStringAttr(policy)),
            b.getNamedAttr("layers", b.getStringAttr(layers)),
            b.getNamedAttr("dropped", b.getI64IntegerAttr(counts.dropped)),
            b.getNamedAttr("dropped_bytes",
                           b.getI64IntegerAttr(counts.droppedBytes)),
            b.getNamedAttr("added", b.getI64IntegerAttr(counts.added)),
            b.getNamedAttr("added_bytes",
                           b.getI64IntegerAttr(counts.addedBytes)),
        }));
  }
};

} // namespace

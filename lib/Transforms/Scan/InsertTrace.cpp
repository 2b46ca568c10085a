// --mapp-insert-trace: MegaScan trace regions in every plan block.
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPINSERTTRACE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

bool isComm(Operation *op) {
  return isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, SendOp,
             RecvOp, EpDispatchOp, EpCombineOp>(op);
}

/// Ops that become plan instructions and so take time worth tracing.
bool isWork(Operation *op) {
  return isa<MappDialect>(op->getDialect()) &&
         !isa<ParamRefOp, GradRefOp, TraceBeginOp, TraceEndOp>(op);
}

/// The module path of an op: `mapp.name` up to a kernel-kind suffix.
std::string nameOf(Operation *op) {
  if (auto n = op->getAttrOfType<StringAttr>("mapp.name"))
    return n.str();
  return op->getName().stripDialect().str();
}

int64_t layerOf(Operation *op, const LayerNames &names) {
  if (auto a = op->getAttrOfType<IntegerAttr>("mapp.layer"))
    return a.getInt();
  if (std::optional<unsigned> layer = names.layerOf(op))
    return *layer;
  return -1;
}

/// The region key of an op at layer granularity: the block's path
/// ("layers.N", "transformer.h.N") or the first component of its name
/// ("wte", "ln_f", "lm_head", "cross_entropy").
std::string layerKey(Operation *op, const LayerNames &names) {
  int64_t layer = layerOf(op, names);
  if (layer >= 0)
    return names.key(layer);
  std::string n = nameOf(op);
  return n.substr(0, n.find('.'));
}

StringRef categoryOf(Operation *op) {
  if (isComm(op))
    return "comm";
  if (isa<AdamWOp, SGDOp, GlobalNormOp>(op))
    return "optimizer";
  return "compute";
}

struct InsertTracePass : mapp::impl::MappInsertTraceBase<InsertTracePass> {
  using Base::Base;
  int64_t nextId = 0;
  LayerNames names{"layers."};

  void bracket(ArrayRef<Operation *> ops, StringRef name, StringRef phase) {
    Operation *first = ops.front(), *last = ops.back();
    OpBuilder b(first);
    Operation *comm = ops.size() == 1 && isComm(first) ? first : nullptr;
    int64_t bytes = 0, peer = -1;
    StringRef group;
    if (comm) {
      bytes = tensorBytes(comm->getNumOperands() ? comm->getOperand(0).getType()
                                                 : comm->getResult(0).getType());
      if (auto p = comm->getAttrOfType<IntegerAttr>("peer"))
        peer = p.getInt();
      if (auto g = comm->getAttrOfType<StringAttr>("group"))
        group = g.getValue();
    }
    int64_t id = nextId++;
    int64_t layer = layerOf(first, names);
    for (Operation *op : ops)
      if (layerOf(op, names) != layer)
        layer = -1;
    b.create<TraceBeginOp>(first->getLoc(), b.getI64IntegerAttr(id),
                           b.getStringAttr(name.str() + " " + phase.str()),
                           b.getStringAttr(categoryOf(first)),
                           b.getI64IntegerAttr(layer),
                           b.getI64IntegerAttr(bytes),
                           b.getI64IntegerAttr(peer), b.getStringAttr(group));
    b.setInsertionPointAfter(last);
    b.create<TraceEndOp>(last->getLoc(), b.getI64IntegerAttr(id));
  }

  void traceBlock(func::FuncOp fn, StringRef phase) {
    SmallVector<Operation *> work;
    for (Operation &op : fn.getBody().front())
      if (isWork(&op))
        work.push_back(&op);
    // Group consecutive ops under one key; comm ops are always alone.
    SmallVector<Operation *> run;
    std::string runKey;
    auto flush = [&] {
      if (!run.empty())
        bracket(run, runKey, phase);
      run.clear();
    };
    for (Operation *op : work) {
      std::string key = granularity == "op"      ? nameOf(op)
                        : granularity == "layer" ? layerKey(op, names)
                                                 : std::string("stage");
      if (isComm(op) || categoryOf(op) == "optimizer" ||
          granularity == "op" || key != runKey)
        flush();
      runKey = isComm(op) ? nameOf(op) : key;
      run.push_back(op);
      if (isComm(op))
        flush();
    }
    flush();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    names = LayerNames::of(module);
    if (granularity != "op" && granularity != "layer" &&
        granularity != "stage") {
      module.emitError("mapp-insert-trace: granularity must be op, layer or "
                       "stage, got '")
          << granularity << "'";
      return signalPassFailure();
    }
    if (every < 0 || window < 1 || (every > 0 && window > every)) {
      module.emitError("mapp-insert-trace: need every >= 0 and 1 <= window "
                       "<= every (every = 0 traces every step)");
      return signalPassFailure();
    }
    bool any = false;
    module.walk([&](TraceBeginOp op) { any = true; });
    if (any) {
      module.emitError("mapp-insert-trace: module is already traced");
      return signalPassFailure();
    }
    for (auto fn : module.getOps<func::FuncOp>())
      if (auto phase = fn->getAttrOfType<StringAttr>("mapp.phase")) {
        any = true;
        traceBlock(fn, phase.getValue());
      }
    if (!any) {
      module.emitError("mapp-insert-trace: no plan block (mapp.phase) to "
                       "trace; run --mapp-autodiff first");
      return signalPassFailure();
    }
    Builder b(&getContext());
    module->setAttr("mapp.trace",
                    b.getDictionaryAttr(
                        {b.getNamedAttr("granularity",
                                        b.getStringAttr(granularity)),
                         b.getNamedAttr("every", b.getI64IntegerAttr(every)),
                         b.getNamedAttr("window",
                                        b.getI64IntegerAttr(window))}));
  }
};

} // namespace

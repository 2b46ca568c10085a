// --mapp-pipeline-partition: cuts @forward into per-(stage, chunk) forward
// functions with explicit send/recv at the cuts, before autodiff (which
// differentiates each stage function: the gradient of a recv is a send back
// to the producer, that of a send a recv from the consumer).
//
// Layers are found from the parameters an op reads (`layers.N.*`, or the
// model's own block container: LayerNames.h); the
// units the partitioner moves are whole layers: unit 0 also holds what
// precedes layer 0 (embeddings) and the last unit what follows the last
// layer (final norm, LM head, loss). Units are grouped into pp·chunks
// contiguous virtual stages minimizing the most expensive one (FLOPs from
// the cost interface); virtual stage k runs on stage k mod pp as chunk
// k / pp (Megatron's interleaved assignment). stage-layers fixes the
// groups; stage-weights scales each stage's FLOPs by its measured slowness
// before the same minimization (uneven stages away from a slow rank).
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/ParallelAttrs.h"
#include "mapp/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Format.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPPIPELINEPARTITION
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// Ops every stage can recompute locally instead of receiving: parameter
/// reads, constants, and the tensor-parallel markers on them.
bool isFree(Operation *op) {
  if (isa<ParamRefOp, FillOp>(op))
    return true;
  if (isa<CopyToGroupOp, ScatterToGroupOp>(op))
    if (Operation *def = op->getOperand(0).getDefiningOp())
      return isFree(def);
  return false;
}

/// The parameter behind a free value, if any.
ParamRefOp paramBehind(Value v) {
  Operation *def = v.getDefiningOp();
  while (def && isa<CopyToGroupOp, ScatterToGroupOp>(def))
    def = def->getOperand(0).getDefiningOp();
  return dyn_cast_or_null<ParamRefOp>(def);
}

struct PipelinePartitionPass
    : mapp::impl::MappPipelinePartitionBase<PipelinePartitionPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (pp < 1 || chunks < 1) {
      module.emitError("mapp-pipeline-partition: pp and chunks must be >= 1");
      return signalPassFailure();
    }
    if (failed(checkAtMost(module, "mapp-pipeline-partition", "pp", pp,
                           kMaxDegree, kMaxDegreeWhy)) ||
        failed(checkAtMost(module, "mapp-pipeline-partition", "chunks", chunks,
                           rt::kMaxLayers,
                           "a chunk holds at least one of the most layers a "
                           "model may have")))
      return signalPassFailure();
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    if (!fn) {
      module.emitError("mapp-pipeline-partition: no function @forward (run "
                       "the pass on the forward graph, before autodiff)");
      return signalPassFailure();
    }
    setParallelInt(module, "pp", pp);
    setParallelInt(module, "chunks", chunks);
    if (pp * chunks == 1)
      return; // one stage: autodiff's @train_forward/@train_backward
    if (failed(partition(module, fn)))
      return signalPassFailure();
  }

  LogicalResult partition(ModuleOp module, func::FuncOp fn) {
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    if (ret.getNumOperands() != 1)
      return fn.emitError("mapp-pipeline-partition: @forward must return "
                          "the loss");

    // Non-free ops in program order, each with its layer (-1: none).
    SmallVector<Operation *> ops;
    SmallVector<int64_t> layerOf;
    const LayerNames names = LayerNames::of(module);
    for (Operation &op : body.without_terminator()) {
      if (isFree(&op))
        continue;
      int64_t layer = -1;
      for (Value v : op.getOperands())
        if (ParamRefOp ref = paramBehind(v)) {
          if (std::optional<unsigned> n = names.layerOf(ref.getParam())) {
            int64_t l = *n;
            if (layer >= 0 && l != layer)
              return op.emitError("mapp-pipeline-partition: op reads "
                                  "parameters of layers ")
                     << layer << " and " << l;
            layer = l;
          }
        }
      ops.push_back(&op);
      layerOf.push_back(layer);
    }

    // Layer L spans [first[L], last[L]]; layers must follow each other.
    SmallVector<int64_t> first, last;
    for (auto [i, l] : llvm::enumerate(layerOf)) {
      if (l < 0)
        continue;
      if (l >= (int64_t)first.size()) {
        first.resize(l + 1, -1);
        last.resize(l + 1, -1);
      }
      if (first[l] < 0)
        first[l] = i;
      last[l] = i;
    }
    int64_t numLayers = first.size();
    for (int64_t l = 0; l < numLayers; ++l) {
      if (first[l] < 0)
        return fn.emitError("mapp-pipeline-partition: no op reads the "
                            "parameters of layer ")
               << l << " (parameters named " << names.prefix()
               << "N.* must number the "
               << "layers 0.." << numLayers - 1 << ")";
      if (l > 0 && first[l] <= last[l - 1])
        return ops[first[l]]->emitError("mapp-pipeline-partition: layer ")
               << l << " starts before layer " << l - 1 << " ends";
    }
    int64_t stages = pp * chunks;
    if (numLayers < stages)
      return fn.emitError("mapp-pipeline-partition: pp=")
             << pp.getValue() << " x chunks=" << chunks.getValue() << " = "
             << stages << " pipeline stages need at least as many layers, "
             << "the model has " << numLayers << " (blocks named "
             << names.prefix() << "N)";

    // Units: unit u = ops [start[u], start[u+1]); unit 0 starts at 0.
    SmallVector<int64_t> start{0};
    for (int64_t l = 1; l < numLayers; ++l)
      start.push_back(first[l]);
    start.push_back(ops.size());
    SmallVector<double> unitCost(numLayers, 0);
    for (int64_t u = 0; u < numLayers; ++u)
      for (int64_t i = start[u]; i < start[u + 1]; ++i)
        if (auto cost = dyn_cast<CostOpInterface>(ops[i]))
          unitCost[u] += cost.getFlops();

    SmallVector<double> prefix{0};
    for (double c : unitCost)
      prefix.push_back(prefix.back() + c);
    // Time per FLOP of virtual stage k's pipeline stage (1: even stages).
    SmallVector<double> weight(pp, 1.0);
    if (!stageWeights.empty()) {
      if (!stageLayers.empty())
        return fn.emitError("mapp-pipeline-partition: give stage-layers or "
                            "stage-weights, not both");
      if ((int64_t)stageWeights.size() != pp)
        return fn.emitError("mapp-pipeline-partition: stage-weights has ")
               << stageWeights.size() << " entries, pp=" << pp.getValue()
               << " needs one per pipeline stage";
      for (auto [s, w] : llvm::enumerate(stageWeights)) {
        if (!(w > 0) || !std::isfinite(w)) {
          char text[32];
          std::snprintf(text, sizeof text, "%g", w);
          return fn.emitError("mapp-pipeline-partition: stage-weights entry ")
                 << s << " is " << text << ", must be a finite number > 0";
        }
        weight[s] = w;
      }
    }
    SmallVector<int64_t> bounds(stages + 1); // units [bounds[k], bounds[k+1])
    if (!stageLayers.empty()) {
      if ((int64_t)stageLayers.size() != stages)
        return fn.emitError("mapp-pipeline-partition: stage-layers has ")
               << stageLayers.size() << " entries, pp=" << pp.getValue()
               << " x chunks=" << chunks.getValue() << " needs " << stages;
      int64_t sum = 0;
      for (auto [k, n] : llvm::enumerate(stageLayers)) {
        if (n < 1)
          return fn.emitError("mapp-pipeline-partition: stage-layers entry ")
                 << k << " is " << n << ", every stage needs a layer";
        sum += n;
        bounds[k + 1] = sum;
      }
      if (sum != numLayers)
        return fn.emitError("mapp-pipeline-partition: stage-layers sums to ")
               << sum << " layers, the model has " << numLayers;
    } else {
      // Linear partition minimizing the largest weighted group: best[k][n]
      // = the smallest max over k groups of the first n units.
      const double inf = std::numeric_limits<double>::infinity();
      std::vector<std::vector<double>> best(
          stages + 1, std::vector<double>(numLayers + 1, inf));
      std::vector<std::vector<int64_t>> cut(
          stages + 1, std::vector<int64_t>(numLayers + 1, 0));
      best[0][0] = 0;
      for (int64_t k = 1; k <= stages; ++k)
        for (int64_t n = k; n <= numLayers; ++n)
          for (int64_t j = k - 1; j < n; ++j) {
            double v = std::max(best[k - 1][j],
                                weight[(k - 1) % pp] * (prefix[n] - prefix[j]));
            // Ties go to the later cut: earlier stages get fewer layers, as
            // the last one also holds the head and loss.
            if (v <= best[k][n]) {
              best[k][n] = v;
              cut[k][n] = j;
            }
          }
      bounds[stages] = numLayers;
      for (int64_t k = stages; k > 0; --k)
        bounds[k - 1] = cut[k][bounds[k]];
    }

    SmallVector<double> vcost(stages, 0), stageCost(pp, 0);
    for (int64_t k = 0; k < stages; ++k) {
      vcost[k] = prefix[bounds[k + 1]] - prefix[bounds[k]];
      stageCost[k % pp] += weight[k % pp] * vcost[k];
    }
    reportBalance(fn, bounds, vcost, stageCost);

    // Virtual stage of every non-free op.
    llvm::DenseMap<Operation *, int64_t> vstageOf;
    for (int64_t k = 0; k < stages; ++k)
      for (int64_t i = start[bounds[k]]; i < start[bounds[k + 1]]; ++i)
        vstageOf[ops[i]] = k;
    Operation *lossDef = ret.getOperand(0).getDefiningOp();
    if (!lossDef || !vstageOf.count(lossDef) ||
        vstageOf[lossDef] != stages - 1)
      return fn.emitError("mapp-pipeline-partition: the loss must be "
                          "computed after the last layer");
    return buildStages(module, fn, ops, vstageOf, stages);
  }

  void reportBalance(func::FuncOp fn, ArrayRef<int64_t> bounds,
                     ArrayRef<double> vcost, ArrayRef<double> stageCost) {
    double mean = 0, max = 0;
    for (double c : stageCost) {
      mean += c / stageCost.size();
      max = std::max(max, c);
    }
    std::string text;
    llvm::raw_string_ostream os(text);
    os << "pipeline partition into " << pp.getValue() << " stage(s) x "
       << chunks.getValue() << " chunk(s):";
    for (size_t k = 0; k + 1 < bounds.size(); ++k)
      os << " [stage " << k % pp << " chunk " << k / pp << ": layers "
         << bounds[k] << "-" << bounds[k + 1] - 1 << ", "
         << llvm::format("%.0f", vcost[k]) << " FLOPs]";
    os << (stageWeights.empty() ? "; per-stage FLOPs"
                                : "; per-stage weighted FLOPs");
    for (double c : stageCost)
      os << " " << llvm::format("%.0f", c);
    os << "; imbalance (max/mean) "
       << llvm::format("%.3f", mean > 0 ? max / mean : 1.0);
    emitRemark(fn.getLoc(), text);
  }

  LogicalResult buildStages(ModuleOp module, func::FuncOp fn,
                            ArrayRef<Operation *> ops,
                            llvm::DenseMap<Operation *, int64_t> &vstageOf,
                            int64_t stages) {
    MLIRContext *ctx = &getContext();
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());

    // Values crossing cut k|k+1: defined by a non-free op at stage <= k,
    // used at a stage > k. Each stage sends them all to the next one,
    // forwarding what it received but does not consume itself.
    auto stageOfUse = [&](Operation *user) -> int64_t {
      if (user == ret.getOperation())
        return stages - 1;
      auto it = vstageOf.find(user);
      return it == vstageOf.end() ? -1 : it->second;
    };
    // lastUse[v]: the latest virtual stage using v (free users: their own
    // users decide, handled by cloning free ops where they are used).
    llvm::MapVector<Value, int64_t> lastUse;
    std::function<void(Value, Operation *)> noteUse = [&](Value v,
                                                          Operation *user) {
      if (isFree(user)) {
        for (Value r : user->getResults())
          for (Operation *u : r.getUsers())
            noteUse(v, u);
        return;
      }
      int64_t s = stageOfUse(user);
      auto [it, inserted] = lastUse.try_emplace(v, s);
      if (!inserted)
        it->second = std::max(it->second, s);
    };
    for (Operation *op : ops)
      for (Value r : op->getResults())
        for (Operation *u : r.getUsers())
          noteUse(r, u);
    // crossing[k]: values to send over cut k|k+1, in definition order.
    std::vector<SmallVector<Value>> crossing(stages);
    for (Operation *op : ops)
      for (Value r : op->getResults()) {
        auto it = lastUse.find(r);
        if (it == lastUse.end())
          continue;
        for (int64_t k = vstageOf[op]; k < it->second; ++k) {
          if (!isa<FloatType>(cast<RankedTensorType>(r.getType())
                                  .getElementType()))
            return op->emitError("mapp-pipeline-partition: a non-float "
                                 "value crosses the cut after virtual stage ")
                   << k;
          crossing[k].push_back(r);
        }
      }
    // Forward tags are even; the gradient of a value sent with tag t goes
    // back with tag t + 1 (autodiff).
    llvm::DenseMap<std::pair<int64_t, Value>, int64_t> tagOf;
    int64_t nextTag = 0;
    for (int64_t k = 0; k < stages; ++k)
      for (Value v : crossing[k]) {
        tagOf[{k, v}] = nextTag;
        nextTag += 2;
      }

    // Which pipeline stages read each parameter (tied weights need their
    // gradients summed across stages).
    llvm::MapVector<StringAttr, llvm::SmallSetVector<int64_t, 2>> paramStages;

    OpBuilder mb(module.getBody(), Block::iterator(fn));
    auto argAttrName = StringAttr::get(ctx, "mapp.input");
    for (int64_t k = 0; k < stages; ++k) {
      int64_t stage = k % pp, chunk = k / pp;
      // The stage's ops, and the free ops and arguments they use.
      SmallVector<Operation *> mine;
      for (Operation *op : ops)
        if (vstageOf[op] == k)
          mine.push_back(op);
      llvm::SetVector<Operation *> freeOps;
      llvm::SetVector<BlockArgument> args;
      std::function<void(Value)> need = [&](Value v) {
        if (auto arg = dyn_cast<BlockArgument>(v)) {
          args.insert(arg);
          return;
        }
        Operation *def = v.getDefiningOp();
        if (isFree(def) && !freeOps.contains(def)) {
          for (Value o : def->getOperands())
            need(o);
          freeOps.insert(def);
        }
      };
      for (Operation *op : mine)
        for (Value v : op->getOperands())
          need(v);
      // Keep arguments in their original order.
      SmallVector<BlockArgument> argList(args.begin(), args.end());
      llvm::sort(argList, [](BlockArgument a, BlockArgument b) {
        return a.getArgNumber() < b.getArgNumber();
      });

      bool isLast = k == stages - 1;
      SmallVector<Type> argTypes, resultTypes;
      for (BlockArgument a : argList)
        argTypes.push_back(a.getType());
      if (isLast)
        resultTypes.push_back(ret.getOperand(0).getType());
      std::string name = "forward_s" + std::to_string(stage) + "_c" +
                         std::to_string(chunk);
      auto sfn = mb.create<func::FuncOp>(
          fn.getLoc(), name, FunctionType::get(ctx, argTypes, resultTypes));
      sfn->setAttr("mapp.phase", StringAttr::get(ctx, "forward"));
      sfn->setAttr("mapp.stage",
                   IntegerAttr::get(IntegerType::get(ctx, 64), stage));
      sfn->setAttr("mapp.chunk",
                   IntegerAttr::get(IntegerType::get(ctx, 64), chunk));
      Block *entry = sfn.addEntryBlock();
      IRMapping map;
      for (auto [i, a] : llvm::enumerate(argList)) {
        map.map(a, entry->getArgument(i));
        // The data loader fills tokens and targets by name: positions in
        // @forward are (tokens, targets) unless already named.
        Attribute input = fn.getArgAttr(a.getArgNumber(), argAttrName);
        if (!input && a.getArgNumber() < 2)
          input = StringAttr::get(ctx, a.getArgNumber() == 0 ? "tokens"
                                                             : "targets");
        if (input)
          sfn.setArgAttr(i, argAttrName, input);
      }
      OpBuilder b = OpBuilder::atBlockBegin(entry);
      int64_t prevStage = (k - 1 + stages) % pp;
      int64_t nextStage = (k + 1) % pp;
      if (k > 0)
        for (Value v : crossing[k - 1]) {
          auto recv = b.create<RecvOp>(v.getLoc(), v.getType(),
                                       b.getI64IntegerAttr(prevStage),
                                       b.getI64IntegerAttr(tagOf[{k - 1, v}]));
          map.map(v, recv.getResult());
        }
      for (Operation *op : freeOps) {
        b.clone(*op, map);
        if (ParamRefOp ref = dyn_cast<ParamRefOp>(op))
          paramStages[ref.getParamAttr().getAttr()].insert(stage);
      }
      for (Operation *op : mine)
        b.clone(*op, map);
      if (!isLast)
        for (Value v : crossing[k])
          b.create<SendOp>(v.getLoc(), map.lookup(v),
                           b.getI64IntegerAttr(nextStage),
                           b.getI64IntegerAttr(tagOf[{k, v}]));
      if (isLast) {
        sfn->setAttr("mapp.loss", UnitAttr::get(ctx));
        b.create<func::ReturnOp>(ret.getLoc(),
                                 map.lookup(ret.getOperand(0)));
      } else {
        b.create<func::ReturnOp>(ret.getLoc());
      }
    }
    for (auto &[name, set] : paramStages)
      if (set.size() > 1) {
        auto param = module.lookupSymbol<ParamOp>(name);
        SmallVector<int64_t> sorted(set.begin(), set.end());
        llvm::sort(sorted);
        param->setAttr("mapp.pp_stages", DenseI64ArrayAttr::get(ctx, sorted));
      }
    fn.erase();
    return success();
  }
};

} // namespace

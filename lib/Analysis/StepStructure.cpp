#include "mapp/Analysis/StepStructure.h"
#include "mapp/rt/PlanLimits.h"

using namespace mlir;
using namespace mapp;

static int64_t intAttr(DictionaryAttr dict, StringRef key, int64_t dflt) {
  if (!dict)
    return dflt;
  if (auto a = dict.getAs<IntegerAttr>(key))
    return a.getInt();
  return dflt;
}

static FailureOr<ParallelLayout> readLayout(ModuleOp module) {
  ParallelLayout l;
  auto dict = module->getAttrOfType<DictionaryAttr>("mapp.parallel");
  if (!dict && module->hasAttr("mapp.parallel"))
    return module.emitError("mapp.parallel must be a dictionary");
  l.tp = intAttr(dict, "tp", 1);
  l.pp = intAttr(dict, "pp", 1);
  l.dp = intAttr(dict, "dp", 1);
  l.ep = intAttr(dict, "ep", 0);
  l.cp = intAttr(dict, "cp", 0);
  l.chunks = intAttr(dict, "chunks", 1);
  l.microbatches = intAttr(dict, "microbatches", 1);
  if (dict)
    if (auto s = dict.getAs<StringAttr>("schedule"))
      l.schedule = s.str();
  if (l.schedule == "adaptive") {
    auto a = module->getAttrOfType<DictionaryAttr>(kAdaptiveAttr);
    if (!a)
      return module.emitError("schedule \"adaptive\" needs the ")
             << kAdaptiveAttr << " policy (run --mapp-pipeline-schedule)";
    AdaptiveLayout al;
    if (auto cap = a.getAs<IntegerAttr>("mem_cap_bytes"))
      al.memCapBytes = cap.getInt();
    if (auto r = a.getAs<FloatAttr>("slow_link_ratio"))
      al.slowLinkRatio = r.getValueAsDouble();
    if (auto w = a.getAs<FloatAttr>("bandwidth_smoothing"))
      al.bandwidthSmoothing = w.getValueAsDouble();
    l.adaptive = al;
  }
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.chunks < 1 || l.microbatches < 1)
    return module.emitError("mapp.parallel degrees, chunks and microbatches "
                            "must be >= 1");
  if (l.ep < 0 || (l.ep > 0 && l.dp % l.ep))
    return module.emitError("mapp.parallel ep ")
           << l.ep << " must divide dp " << l.dp;
  if (l.cp < 0 || (l.cp > 0 && l.dp % l.cp))
    return module.emitError("mapp.parallel cp ")
           << l.cp << " must divide dp " << l.dp;
  // The bounds the passes that set these keep (mapp/rt/PlanLimits.h): one
  // program per rank, per-microbatch bookkeeping.
  if (l.tp > rt::kMaxWorldSize || l.pp > rt::kMaxWorldSize ||
      l.dp > rt::kMaxWorldSize || l.tp * l.pp * l.dp > rt::kMaxWorldSize)
    return module.emitError("mapp.parallel tp x pp x dp = ")
           << l.tp << " x " << l.pp << " x " << l.dp << " is more than "
           << rt::kMaxWorldSize << " ranks";
  if (l.microbatches > rt::kMaxMicrobatches || l.chunks > rt::kMaxLayers)
    return module.emitError("mapp.parallel microbatches ")
           << l.microbatches << " and chunks " << l.chunks
           << " must be at most " << rt::kMaxMicrobatches << " and "
           << rt::kMaxLayers;
  return l;
}

FailureOr<StepStructure> StepStructure::analyze(ModuleOp module) {
  StepStructure s;
  FailureOr<ParallelLayout> layout = readLayout(module);
  if (failed(layout))
    return failure();
  s.layout = *layout;

  for (auto fn : module.getOps<func::FuncOp>()) {
    auto phaseAttr = fn->getAttrOfType<StringAttr>("mapp.phase");
    if (!phaseAttr)
      continue;
    StepBlock b;
    b.func = fn;
    StringRef phase = phaseAttr.getValue();
    StringRef split;
    if (auto a = fn->getAttrOfType<StringAttr>("mapp.split"))
      split = a.getValue();
    if (phase == "forward")
      b.phase = Phase::Forward;
    else if (phase == "backward" && split.empty())
      b.phase = Phase::Backward;
    else if (phase == "backward" && split == "input")
      b.phase = Phase::BackwardInput;
    else if (phase == "backward" && split == "weight")
      b.phase = Phase::BackwardWeight;
    else if (phase == "optimizer")
      b.phase = Phase::Optimizer;
    else
      return fn.emitError("unknown mapp.phase \"")
             << phase << "\"" << (split.empty() ? "" : " with mapp.split \"")
             << split << (split.empty() ? "" : "\"");
    if (auto a = fn->getAttrOfType<IntegerAttr>("mapp.stage"))
      b.stage = a.getInt();
    else
      b.everyStage = b.phase == Phase::Optimizer;
    if (auto a = fn->getAttrOfType<IntegerAttr>("mapp.chunk"))
      b.chunk = a.getInt();
    if (b.stage < 0 || b.stage >= s.layout.pp)
      return fn.emitError("mapp.stage ")
             << b.stage << " outside the pipeline (pp = " << s.layout.pp << ")";
    if (b.chunk < 0 || b.chunk >= s.layout.chunks)
      return fn.emitError("mapp.chunk ")
             << b.chunk << " outside [0, " << s.layout.chunks << ")";
    b.hasLoss = fn->hasAttr("mapp.loss") ||
                (b.phase == Phase::Forward && s.layout.pp == 1 &&
                 fn.getFunctionType().getNumResults() > 0);
    if (b.hasLoss && (fn.getFunctionType().getNumResults() == 0 ||
                      fn.getFunctionType().getResult(0) !=
                          RankedTensorType::get({}, Float32Type::get(
                                                        module.getContext()))))
      return fn.emitError("a forward with the loss must return tensor<f32> "
                          "first");
    if (fn.getBody().getBlocks().size() != 1)
      return fn.emitError("plan blocks must have exactly one basic block");
    s.blocks.push_back(b);
  }
  if (s.blocks.empty())
    return module.emitError("no function carries mapp.phase: run "
                            "--mapp-autodiff (and --mapp-optimizer) first");

  // Plan order is the order one microbatch runs a stage's blocks (the memory
  // plan's live ranges rely on it): forwards by ascending chunk, backwards
  // by descending chunk (the gradient flows from the last virtual stage
  // back), the optimizer last.
  auto order = [](const StepBlock &b) {
    int rank = b.phase == Phase::Forward     ? 0
               : b.phase == Phase::Optimizer ? 2
                                             : 1;
    return std::make_tuple(rank, b.stage, rank == 1 ? -b.chunk : b.chunk,
                           (int)b.phase);
  };
  llvm::stable_sort(s.blocks, [&](const StepBlock &a, const StepBlock &b) {
    return order(a) < order(b);
  });

  // Every backward has its producer and takes exactly its saved results.
  for (const StepBlock &b : s.blocks) {
    if (b.phase == Phase::Forward || b.phase == Phase::Optimizer)
      continue;
    const StepBlock *producer = s.producerOf(b);
    if (!producer)
      return b.func.emitError("backward of stage ")
             << b.stage << " chunk " << b.chunk << " has no "
             << (b.phase == Phase::BackwardWeight ? "backward-input"
                                                  : "forward");
    ArrayRef<Type> saved = producer->func.getFunctionType().getResults().drop_front(
        producer->hasLoss);
    if (saved != b.func.getFunctionType().getInputs())
      return b.func.emitError("arguments do not match the saved results of @")
             << producer->func.getSymName();
  }
  return s;
}

SmallVector<const StepBlock *> StepStructure::blocksOfStage(int64_t stage) const {
  SmallVector<const StepBlock *> out;
  for (const StepBlock &b : blocks)
    if (b.stage == stage || b.everyStage)
      out.push_back(&b);
  return out;
}

const StepBlock *StepStructure::producerOf(const StepBlock &consumer) const {
  Phase want = consumer.phase == Phase::BackwardWeight ? Phase::BackwardInput
                                                       : Phase::Forward;
  if (consumer.phase == Phase::Forward || consumer.phase == Phase::Optimizer)
    return nullptr;
  for (const StepBlock &b : blocks)
    if (b.phase == want && b.stage == consumer.stage &&
        b.chunk == consumer.chunk)
      return &b;
  return nullptr;
}

Value StepStructure::canonical(Value v) const {
  auto arg = dyn_cast<BlockArgument>(v);
  if (!arg)
    return v;
  auto fn = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
  for (const StepBlock &b : blocks) {
    if (b.func != fn)
      continue;
    const StepBlock *producer = producerOf(b);
    if (!producer)
      return v;
    auto ret = cast<func::ReturnOp>(
        producer->func.getBody().front().getTerminator());
    return canonical(
        ret.getOperand(arg.getArgNumber() + (producer->hasLoss ? 1 : 0)));
  }
  return v;
}

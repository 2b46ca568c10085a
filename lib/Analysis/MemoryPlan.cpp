#include "mapp/Analysis/MemoryPlan.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"

using namespace mlir;
using namespace mapp;

static uint64_t alignUp(uint64_t x) {
  return (x + kPlanAlignment - 1) / kPlanAlignment * kPlanAlignment;
}

bool mapp::isPersistentAlias(Value v) {
  return isa_and_nonnull<ParamRefOp, GradRefOp>(v.getDefiningOp());
}

int64_t mapp::inFlightMicrobatches(ModuleOp module, int64_t stage,
                                   StringRef kind) {
  // A microbatch holds its slot from its first task on the stage to its last
  // (every chunk's activations of one microbatch share the slot); slot =
  // microbatch mod slots, so the span of microbatches alive at once must
  // fit.
  int64_t best = 1;
  for (auto sched : module.getOps<ScheduleOp>()) {
    if (stage >= (int64_t)sched.getTables().size() ||
        (!kind.empty() && sched.getKind() != kind))
      continue;
    auto table = cast<ArrayAttr>(sched.getTables()[stage]);
    llvm::DenseMap<int64_t, std::pair<int64_t, int64_t>> life;
    for (auto [i, a] : llvm::enumerate(table)) {
      int64_t mb = cast<TaskAttr>(a).getMicrobatch();
      auto [it, fresh] = life.try_emplace(mb, (int64_t)i, (int64_t)i);
      if (!fresh)
        it->second.second = i;
    }
    for (int64_t t = 0; t < (int64_t)table.size(); ++t) {
      int64_t lo = INT64_MAX, hi = INT64_MIN;
      for (auto &[mb, span] : life)
        if (span.first <= t && t <= span.second) {
          lo = std::min(lo, mb);
          hi = std::max(hi, mb);
        }
      if (hi >= lo)
        best = std::max(best, hi - lo + 1);
    }
  }
  return best;
}

int64_t mapp::peakStashed(ScheduleOp sched, int64_t stage) {
  if (stage >= (int64_t)sched.getTables().size())
    return 0;
  int64_t now = 0, peak = 0;
  for (Attribute a : cast<ArrayAttr>(sched.getTables()[stage])) {
    TaskKind k = cast<TaskAttr>(a).getKind();
    if (k == TaskKind::Forward)
      peak = std::max(peak, ++now);
    else if (k == TaskKind::Backward || k == TaskKind::BackwardWeight)
      --now;
  }
  return peak;
}

LogicalResult mapp::applyMemCap(ModuleOp module, const ParallelLayout &layout,
                                StageMemory &mem) {
  if (!layout.adaptive || layout.adaptive->memCapBytes == 0)
    return success();
  uint64_t cap = layout.adaptive->memCapBytes;
  int64_t dfcSlots = inFlightMicrobatches(module, mem.stage, "dfc");
  uint64_t need = mem.persistentBytes + uint64_t(dfcSlots) * mem.arenaBytes;
  if (cap < need)
    return module.emitError("adaptive schedule: mem-cap ")
           << cap << " B is below what the dfc table needs on stage "
           << mem.stage << ": persistent " << mem.persistentBytes << " B + "
           << dfcSlots << " arena slot(s) x " << mem.arenaBytes << " B = "
           << need << " B";
  if (mem.arenaBytes) {
    uint64_t fit = (cap - mem.persistentBytes) / mem.arenaBytes;
    mem.slots = std::min<int64_t>(mem.slots, std::max<uint64_t>(fit, 1));
  }
  return success();
}

/// Whether `op` may write the storage of one of its operands. Compute ops
/// are pure (their results are fresh values); collectives, send, probe and
/// grad_accumulate only read their operands (they write fresh results, a
/// peer, the probe sink or the pool's Grad buffer), and so do the fp8 GEMMs
/// but for their meta parameter. Anything else with
/// memory effects (updates, grad_sync, param_gather, trace marks, ops this
/// list does not know) is assumed to write.
static bool mayWriteOperands(Operation *op) {
  if (isMemoryEffectFree(op))
    return false;
  // The fp8 GEMMs write only their meta operand (a parameter, in the pool).
  return !isa<AllReduceOp, AllGatherOp, ReduceScatterOp, AllToAllOp, SendOp,
              EpDispatchOp, EpCombineOp, CpAttentionOp, CpAttentionGradOp,
              ProbeOp, GradAccumulateOp,
              Fp8LinearOp, Fp8MatmulOp>(op);
}

/// Reshapes of the stage whose result can share its operand's storage: a
/// reshape is a row-major copy with the same dtype and element count, so
/// the bytes are identical. Not aliased: reshapes of parameters or
/// gradients (the pool, written by updates and grad_accumulate) and any
/// reshape chain whose storage some op may write in place (the view would
/// see the write, the copy would not). Returns result -> storage owner.
static llvm::DenseMap<Value, Value>
findReshapeAliases(const StepStructure &step,
                   ArrayRef<const StepBlock *> blocks, int64_t &copied) {
  llvm::DenseMap<Value, Value> owner;
  auto ownerOf = [&](Value v) {
    v = step.canonical(v);
    auto it = owner.find(v);
    return it == owner.end() ? v : it->second;
  };
  int64_t reshapes = 0;
  llvm::DenseSet<Value> written;
  for (const StepBlock *b : blocks)
    for (Operation &op : b->func.getBody().front()) {
      if (auto r = dyn_cast<ReshapeOp>(op)) {
        ++reshapes;
        Value x = ownerOf(r.getX());
        auto in = dyn_cast<RankedTensorType>(x.getType());
        auto out = cast<RankedTensorType>(r.getType());
        if (!isPersistentAlias(x) && in && in.hasStaticShape() &&
            out.hasStaticShape() &&
            in.getElementType() == out.getElementType() &&
            tensorBytes(in) == tensorBytes(out))
          owner[r.getResult()] = x;
        continue;
      }
      if (mayWriteOperands(&op))
        for (Value v : op.getOperands())
          written.insert(ownerOf(v));
    }
  llvm::DenseMap<Value, Value> aliases;
  for (auto &[result, storage] : owner)
    if (!written.contains(storage))
      aliases[result] = storage;
  copied = reshapes - (int64_t)aliases.size();
  return aliases;
}

FailureOr<bool> mapp::bf16Activations(ModuleOp module) {
  Attribute a = module->getAttr(kActivationStorageAttr);
  if (!a)
    return false;
  auto s = dyn_cast<StringAttr>(a);
  if (!s || (s.getValue() != "f32" && s.getValue() != "bf16"))
    return module.emitError(kActivationStorageAttr)
           << " must be \"f32\" or \"bf16\", got " << a;
  return s.getValue() == "bf16";
}

/// The arena values stored as bf16 (see planStageMemory): canonical values
/// and alias results; `arena` holds the storage owners.
static llvm::DenseSet<Value>
findBf16Values(const StepStructure &step, ArrayRef<const StepBlock *> blocks,
               ArrayRef<Value> arena,
               const llvm::DenseMap<Value, Value> &aliasOf) {
  llvm::DenseSet<Value> feedsGrad;
  for (const StepBlock *b : blocks)
    b->func.walk([&](GradAccumulateOp op) {
      Value g = step.canonical(op.getGrad());
      feedsGrad.insert(g);
      if (auto a = aliasOf.find(g); a != aliasOf.end())
        feedsGrad.insert(a->second);
    });
  auto qualifies = [&](Value v) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.getElementType().isF32() && t.getRank() >= 2 &&
           !feedsGrad.contains(v);
  };
  llvm::DenseMap<Value, bool> owner;
  for (Value v : arena)
    owner[v] = qualifies(v);
  for (auto &[result, storage] : aliasOf)
    owner[storage] = owner.lookup(storage) && qualifies(result);
  llvm::DenseSet<Value> bf16;
  for (auto &[v, ok] : owner)
    if (ok)
      bf16.insert(v);
  for (auto &[result, storage] : aliasOf)
    if (bf16.contains(storage))
      bf16.insert(result);
  return bf16;
}

namespace {
struct Interval {
  Value value;
  uint64_t bytes;
  int64_t begin, end; // inclusive op indices
};
} // namespace

FailureOr<StageMemory> mapp::planStageMemory(ModuleOp module,
                                             const StepStructure &step,
                                             int64_t stage,
                                             bool aliasReshapes) {
  StageMemory mem;
  mem.stage = stage;
  SmallVector<const StepBlock *> blocks = step.blocksOfStage(stage);

  // Parameters the stage's forward/backward touch, plus their optimizer state.
  llvm::DenseSet<StringAttr> owned;
  for (const StepBlock *b : blocks)
    if (b->phase != Phase::Optimizer)
      b->func.walk([&](Operation *op) {
        if (auto ref = op->getAttrOfType<FlatSymbolRefAttr>("param"))
          owned.insert(ref.getAttr());
      });
  llvm::DenseMap<StringAttr, unsigned> states;
  for (const StepBlock *b : blocks)
    if (b->phase == Phase::Optimizer) {
      b->func.walk([&](AdamWOp op) { states[op.getParamAttr().getAttr()] = 2; });
      b->func.walk([&](SGDOp op) { states[op.getParamAttr().getAttr()] = 1; });
    }
  for (auto p : module.getOps<ParamOp>()) {
    if (!owned.contains(p.getSymNameAttr()))
      continue;
    ParamStorage s;
    s.name = p.getSymNameAttr();
    s.type = cast<RankedTensorType>(p.getType());
    s.numStates = states.lookup(s.name);
    mem.params.insert({s.name, s});
  }
  for (auto &[name, s] : mem.params) {
    uint64_t bytes = alignUp(tensorBytes(s.type));
    s.paramOffset = mem.persistentBytes;
    s.gradOffset = s.paramOffset + bytes;
    mem.persistentBytes += 2 * bytes;
    for (unsigned i = 0; i < s.numStates; ++i) {
      s.stateOffsets.push_back(mem.persistentBytes);
      mem.persistentBytes += bytes;
    }
  }

  mem.aliasOf = findReshapeAliases(step, blocks, mem.copiedReshapes);
  if (!aliasReshapes) {
    mem.copiedReshapes += mem.aliasOf.size();
    mem.aliasOf.clear();
  }

  // Live intervals over the stage's blocks in plan order; a reshape alias
  // extends its storage owner's interval instead of having its own.
  llvm::MapVector<Value, Interval> live;
  int64_t index = 0;
  auto define = [&](Value v, int64_t at) -> LogicalResult {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    if (!t || !t.hasStaticShape())
      return emitError(v.getLoc(), "memory plan needs static tensor shapes, "
                                   "got ")
             << v.getType();
    live.insert({v, Interval{v, alignUp(tensorBytes(t)), at, at}});
    return success();
  };
  auto use = [&](Value v, int64_t at) {
    v = step.canonical(v);
    if (auto a = mem.aliasOf.find(v); a != mem.aliasOf.end())
      v = a->second;
    auto it = live.find(v);
    if (it != live.end())
      it->second.end = std::max(it->second.end, at);
  };
  for (const StepBlock *b : blocks) {
    Block &body = b->func.getBody().front();
    for (BlockArgument arg : body.getArguments())
      if (step.canonical(arg) == Value(arg) && failed(define(arg, index)))
        return failure();
    for (Operation &op : body) {
      ++index;
      for (Value operand : op.getOperands())
        use(operand, index);
      for (Value r : op.getResults()) {
        if (isPersistentAlias(r))
          continue;
        if (auto a = mem.aliasOf.find(r); a != mem.aliasOf.end()) {
          if (live.count(a->second))
            continue;
          // The owner has no arena storage on this stage: keep the copy.
          mem.aliasOf.erase(a);
          ++mem.copiedReshapes;
        }
        if (failed(define(r, index)))
          return failure();
      }
    }
  }

  FailureOr<bool> bf16 = bf16Activations(module);
  if (failed(bf16))
    return failure();
  if (*bf16) {
    SmallVector<Value> arena;
    for (auto &[v, iv] : live)
      arena.push_back(v);
    mem.bf16 = findBf16Values(step, blocks, arena, mem.aliasOf);
    for (auto &[v, iv] : live)
      if (mem.bf16.contains(v))
        iv.bytes = alignUp(cast<RankedTensorType>(v.getType()).getNumElements() *
                           2);
  }

  // Greedy best placement, biggest first: each value takes the lowest offset
  // that overlaps no placed value with an intersecting live range.
  SmallVector<Interval *> order;
  for (auto &[v, iv] : live)
    order.push_back(&iv);
  llvm::stable_sort(order, [](const Interval *a, const Interval *b) {
    return a->bytes > b->bytes;
  });
  SmallVector<std::pair<Interval *, uint64_t>> placed;
  for (Interval *iv : order) {
    SmallVector<std::pair<uint64_t, uint64_t>> busy;
    for (auto &[other, off] : placed)
      if (other->begin <= iv->end && iv->begin <= other->end)
        busy.push_back({off, off + other->bytes});
    llvm::sort(busy);
    uint64_t offset = 0;
    for (auto [lo, hi] : busy) {
      if (offset + iv->bytes <= lo)
        break;
      offset = std::max(offset, hi);
    }
    placed.push_back({iv, offset});
    mem.offsets[iv->value] = offset;
    mem.arenaBytes = std::max(mem.arenaBytes, offset + iv->bytes);
    mem.naiveArenaBytes += iv->bytes;
  }
  for (auto &[result, storage] : mem.aliasOf)
    mem.offsets[result] = mem.offsets.lookup(storage);
  mem.slots = inFlightMicrobatches(module, stage);

  // The stash: what each forward returns for its backward.
  for (const StepBlock *b : blocks) {
    if (b->phase != Phase::Forward)
      continue;
    auto ret = cast<func::ReturnOp>(b->func.getBody().front().getTerminator());
    llvm::DenseSet<Value> owners;
    uint64_t bytes = 0;
    for (Value v : ret.getOperands().drop_front(b->hasLoss ? 1 : 0)) {
      v = step.canonical(v);
      if (auto a = mem.aliasOf.find(v); a != mem.aliasOf.end())
        v = a->second;
      auto it = live.find(v);
      if (it != live.end() && owners.insert(v).second)
        bytes += it->second.bytes;
    }
    mem.stashBytes = std::max(mem.stashBytes, bytes);
  }
  for (auto sched : module.getOps<ScheduleOp>())
    mem.stashPeaks.push_back(
        {sched.getKind().str(), peakStashed(sched, stage)});
  return mem;
}

// Lowers a training module to one plan Program per global rank.
#include "mapp/Target/Plan/PlanBuilder.h"
#include "FbdPlan.h"
#include "mapp/Analysis/LayerNames.h"
#include "mapp/Analysis/MemoryPlan.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Target/Plan/plan_generated.h"
#include "mapp/rt/KernelVocab.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
using namespace mapp;
namespace fb = mapp::plan;

namespace {

FailureOr<fb::DType> dtypeOf(Location loc, Type t) {
  if (t.isF32())
    return fb::DType::f32;
  if (t.isBF16())
    return fb::DType::bf16;
  if (t.isF16())
    return fb::DType::f16;
  if (t.isInteger(32))
    return fb::DType::i32;
  if (t.isInteger(64))
    return fb::DType::i64;
  return emitError(loc, "plan: element type ") << t << " has no plan dtype";
}

fb::BlockKind blockKind(Phase p) {
  switch (p) {
  case Phase::Forward:
    return fb::BlockKind::Forward;
  case Phase::Backward:
    return fb::BlockKind::Backward;
  case Phase::BackwardInput:
    return fb::BlockKind::BackwardInput;
  case Phase::BackwardWeight:
    return fb::BlockKind::BackwardWeight;
  case Phase::Optimizer:
    return fb::BlockKind::Optimizer;
  }
  llvm_unreachable("phase");
}

/// Layer index from `mapp.layer` or the name of the model's block ("layers.N.",
/// "transformer.h.N.": LayerNames); -1 if none.
int32_t layerOf(Operation *op, const LayerNames &names) {
  if (auto a = op->getAttrOfType<IntegerAttr>("mapp.layer"))
    return a.getInt();
  if (std::optional<unsigned> layer = names.layerOf(op))
    return *layer;
  return -1;
}

/// The data-loader role of a forward argument: its `mapp.input`, or, when no
/// argument has one and the function takes exactly two integer tensors,
/// (tokens, targets) by position.
StringAttr inputRole(func::FuncOp fn, unsigned i) {
  if (auto a = fn.getArgAttrOfType<StringAttr>(i, "mapp.input"))
    return a;
  ArrayRef<Type> in = fn.getFunctionType().getInputs();
  for (unsigned j = 0; j < in.size(); ++j)
    if (fn.getArgAttr(j, "mapp.input"))
      return {};
  auto isInt = [](Type t) {
    return cast<RankedTensorType>(t).getElementType().isInteger();
  };
  if (in.size() != 2 || !isInt(in[0]) || !isInt(in[1]))
    return {};
  return StringAttr::get(fn.getContext(), i == 0 ? "tokens" : "targets");
}

/// Builds the Program of one rank.
class ProgramBuilder {
public:
  ProgramBuilder(ModuleOp module, const StepStructure &step,
                 const StageMemory &mem, fb::ProgramT &prog,
                 const LayerNames &names)
      : module(module), step(step), mem(mem), prog(prog), names(names) {}

  LogicalResult build() {
    if (failed(addParams()))
      return failure();
    llvm::DenseMap<const StepBlock *, int32_t> blockIndex;
    for (const StepBlock *b : step.blocksOfStage(mem.stage)) {
      blockIndex[b] = prog.blocks.size();
      if (failed(addBlock(*b)))
        return failure();
    }
    prog.arena_bytes = mem.arenaBytes;
    prog.persistent_bytes = mem.persistentBytes;
    prog.slots = mem.slots;
    prog.peak_bytes = mem.peakBytes();
    prog.stash_bytes = mem.stashBytes;
    return addTasks(blockIndex);
  }

private:
  int32_t addValue(std::string name, fb::ValueKind kind, RankedTensorType t,
                   fb::DType dtype, uint64_t offset, int32_t param = -1) {
    auto v = std::make_unique<fb::ValueT>();
    v->name = std::move(name);
    v->kind = kind;
    v->dtype = dtype;
    v->shape.assign(t.getShape().begin(), t.getShape().end());
    v->offset = offset;
    v->bytes = tensorBytes(t);
    v->param = param;
    prog.values.push_back(std::move(v));
    return prog.values.size() - 1;
  }

  LogicalResult addParams() {
    for (auto &[name, s] : mem.params) {
      FailureOr<fb::DType> dt = dtypeOf(module.getLoc(), s.type.getElementType());
      if (failed(dt))
        return failure();
      int32_t p = addValue(name.str(), fb::ValueKind::Param, s.type, *dt,
                           s.paramOffset);
      // A sharded parameter holds its piece (docs/plan-lowering.md).
      if (auto decl = module.lookupSymbol<ParamOp>(name)) {
        fb::ValueT &v = *prog.values[p];
        if (auto dim = decl.getShardDimAttr()) {
          v.shard_dim = dim.getInt();
          v.shard_group =
              decl.getShardGroupAttr() ? decl.getShardGroupAttr().str() : "tp";
          if (auto blocks = decl.getShardBlocksAttr())
            v.shard_blocks = blocks.getInt();
        }
      }
      int32_t g = addValue(name.str() + ".grad", fb::ValueKind::Grad, s.type,
                           *dt, s.gradOffset, p);
      SmallVector<int32_t, 2> states;
      for (auto [i, off] : llvm::enumerate(s.stateOffsets))
        states.push_back(addValue(name.str() + ".state" + std::to_string(i),
                                  fb::ValueKind::OptState, s.type, *dt, off,
                                  p));
      paramIds[name] = {p, g, states};
    }
    return success();
  }

  /// The value id of an SSA value, creating arena values on first sight.
  FailureOr<int32_t> idOf(Value v) {
    v = step.canonical(v);
    if (auto ref = v.getDefiningOp<ParamRefOp>())
      return paramId(ref, ref.getParamAttr().getAttr(), 0);
    if (auto ref = v.getDefiningOp<GradRefOp>())
      return paramId(ref, ref.getParamAttr().getAttr(), 1);
    if (auto it = ids.find(v); it != ids.end())
      return it->second;
    auto t = cast<RankedTensorType>(v.getType());
    FailureOr<fb::DType> dt = dtypeOf(v.getLoc(), t.getElementType());
    if (failed(dt))
      return failure();
    auto off = mem.offsets.find(v);
    if (off == mem.offsets.end())
      return emitError(v.getLoc(), "plan: value has no memory slot");
    std::string name;
    fb::ValueKind kind = fb::ValueKind::Temp;
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      auto fn = cast<func::FuncOp>(arg.getOwner()->getParentOp());
      StringAttr input = inputRole(fn, arg.getArgNumber());
      if (!input)
        return emitError(v.getLoc(), "plan: argument ")
               << arg.getArgNumber() << " of @" << fn.getSymName()
               << " is neither an input nor a saved activation";
      name = input.str();
      kind = fb::ValueKind::Input;
    } else if (auto n = v.getDefiningOp()->getAttrOfType<StringAttr>(
                   "mapp.name")) {
      name = n.str();
    } else {
      name = v.getDefiningOp()->getName().stripDialect().str();
    }
    int32_t id = addValue(name, kind, t, *dt, off->second);
    if (mem.bf16.contains(v)) {
      prog.values[id]->storage_bf16 = true;
      prog.values[id]->bytes = t.getNumElements() * 2;
    }
    ids[v] = id;
    if (kind == fb::ValueKind::Input)
      (name == "tokens" ? prog.tokens : prog.targets) = id;
    return id;
  }

  FailureOr<int32_t> paramId(Operation *user, StringAttr name, int which) {
    auto it = paramIds.find(name);
    if (it == paramIds.end())
      return user->emitError("plan: parameter @")
             << name.getValue() << " is not owned by stage " << mem.stage;
    return which == 0 ? it->second.param : it->second.grad;
  }

  LogicalResult addAttrs(Operation *op, fb::InstrT &instr) {
    for (NamedAttribute na : op->getAttrs()) {
      StringRef key = na.getName().getValue();
      if (key.starts_with("mapp."))
        continue;
      // grad_sync / param_gather: the parameter list is the operands.
      if (key == "params" && isa<GradSyncOp, ParamGatherOp>(op))
        continue;
      auto a = std::make_unique<fb::AttrT>();
      a->key = key.str();
      Attribute v = na.getValue();
      if (auto i = dyn_cast<IntegerAttr>(v)) {
        a->kind = fb::AttrKind::Int;
        a->i = i.getType().isInteger(1) ? i.getValue().getZExtValue()
                                        : i.getInt();
      } else if (auto f = dyn_cast<FloatAttr>(v)) {
        a->kind = fb::AttrKind::Float;
        a->f = f.getValueAsDouble();
      } else if (auto s = dyn_cast<StringAttr>(v)) {
        a->kind = fb::AttrKind::Str;
        a->s = s.str();
      } else if (auto s = dyn_cast<FlatSymbolRefAttr>(v)) {
        a->kind = fb::AttrKind::Str;
        a->s = s.getValue().str();
      } else if (isa<UnitAttr>(v)) {
        a->kind = fb::AttrKind::Int;
        a->i = 1;
      } else if (auto arr = dyn_cast<DenseI64ArrayAttr>(v)) {
        a->kind = fb::AttrKind::Ints;
        a->ints.assign(arr.asArrayRef().begin(), arr.asArrayRef().end());
      } else if (auto elems = dyn_cast<DenseFPElementsAttr>(v)) {
        // mapp.constant's elements, row-major.
        a->kind = fb::AttrKind::Floats;
        for (const APFloat &f : elems.getValues<APFloat>())
          a->floats.push_back(f.convertToDouble());
      } else {
        return op->emitError("plan: attribute '")
               << key << "' of kind " << v << " cannot be serialized";
      }
      instr.attrs.push_back(std::move(a));
    }
    return success();
  }

  /// The gradient norm across tp/pp/dp ranks is the executor's (every
  /// gradient element counted once in the world, runtime/README.md): a
  /// per-rank global_norm would see only the rank's own gradients, so with
  /// several ranks the plan drops it and the updates clip by the executor's.
  bool dropNorm() const { return step.layout.worldSize() > 1; }

  /// ZeRO-1: the elements [zero_begin, zero_end) of the parameter that fall
  /// in this dp rank's slice [r·n/g, (r+1)·n/g) of its flat bucket (the
  /// param_gather of this stage that lists it; n padded to a multiple of g).
  LogicalResult addZeroRange(Operation *op, fb::InstrT &instr) {
    auto name = op->getAttrOfType<FlatSymbolRefAttr>("param").getAttr();
    auto fn = op->getParentOfType<func::FuncOp>();
    ParamGatherOp bucket;
    int buckets = 0;
    fn.walk([&](ParamGatherOp g) {
      if (auto st = g->getAttrOfType<IntegerAttr>("mapp.stage"))
        if (st.getInt() != mem.stage)
          return;
      for (Attribute a : g.getParams())
        if (cast<FlatSymbolRefAttr>(a).getAttr() == name) {
          bucket = g;
          ++buckets;
        }
    });
    if (buckets > 1)
      return op->emitError("plan: ZeRO-sharded parameter @")
             << name.getValue() << " is in " << buckets
             << " buckets on stage " << mem.stage;
    if (!bucket)
      return op->emitError("plan: ZeRO-sharded update of @")
             << name.getValue() << " has no param_gather on stage "
             << mem.stage;
    int64_t off = 0, mine = -1, size = 0, n = 0;
    for (Attribute a : bucket.getParams()) {
      auto it = mem.params.find(cast<FlatSymbolRefAttr>(a).getAttr());
      if (it == mem.params.end())
        return bucket.emitError("plan: bucket parameter ")
               << a << " is not on stage " << mem.stage;
      int64_t e = it->second.type.getNumElements();
      if (it->first == name) {
        mine = off;
        size = e;
      }
      off += e;
    }
    int64_t g = step.layout.dp;
    n = (off + g - 1) / g * g;
    int64_t lo = prog.dp * (n / g), hi = lo + n / g;
    auto attr = [&](const char *key, int64_t v) {
      auto a = std::make_unique<fb::AttrT>();
      a->key = key;
      a->kind = fb::AttrKind::Int;
      a->i = v;
      instr.attrs.push_back(std::move(a));
    };
    attr("zero_begin", std::clamp<int64_t>(lo - mine, 0, size));
    attr("zero_end", std::clamp<int64_t>(hi - mine, 0, size));
    return success();
  }

  /// grad_sync `ranks` are pipeline stages in the IR (a tied parameter's
  /// replicas), global ranks with the executing rank's (dp, tp) in plans.
  void resolveStageRanks(fb::InstrT &instr) {
    for (auto &a : instr.attrs)
      if (a->key == "ranks")
        for (int64_t &r : a->ints)
          r = r * step.layout.tp * step.layout.dp + prog.dp * step.layout.tp +
              prog.tp;
  }

  /// Send/recv peers are pipeline stages in the IR, global ranks in plans.
  void resolvePeer(fb::InstrT &instr) {
    for (auto &a : instr.attrs)
      if (a->key == "peer")
        a->i = a->i * step.layout.tp * step.layout.dp +
               prog.dp * step.layout.tp + prog.tp;
  }

  LogicalResult addInstr(Operation *op, fb::BlockT &block) {
    auto instr = std::make_unique<fb::InstrT>();
    instr->kernel = op->getName().stripDialect().str();
    // The op's name is the kernel's: it must be one the runtime knows.
    if (!rt::findKernelInfo(instr->kernel))
      return op->emitError("plan: '")
             << op->getName()
             << "' is not a kernel of the runtime's vocabulary "
                "(runtime/include/mapp/rt/KernelVocab.def)";
    instr->layer = layerOf(op, names);
    if (auto n = op->getAttrOfType<StringAttr>("mapp.name"))
      instr->name = n.str();
    auto push = [&](std::vector<int32_t> &list, Value v) -> LogicalResult {
      FailureOr<int32_t> id = idOf(v);
      if (failed(id))
        return failure();
      list.push_back(*id);
      return success();
    };
    if (isa<GradSyncOp, ParamGatherOp>(op)) {
      // The bucket's gradient (grad_sync, read and written in place) or
      // parameter (param_gather, in place) buffers, in list order.
      bool grads = isa<GradSyncOp>(op);
      for (Attribute a : op->getAttrOfType<ArrayAttr>("params")) {
        FailureOr<int32_t> id =
            paramId(op, cast<FlatSymbolRefAttr>(a).getAttr(), grads ? 1 : 0);
        if (failed(id))
          return failure();
        instr->inputs.push_back(*id);
        if (grads)
          instr->outputs.push_back(*id);
      }
    } else if (auto acc = dyn_cast<GradAccumulateOp>(op)) {
      FailureOr<int32_t> g = paramId(op, acc.getParamAttr().getAttr(), 1);
      if (failed(g) || failed(push(instr->inputs, acc.getGrad())))
        return failure();
      instr->outputs.push_back(*g);
    } else if (auto upd = dyn_cast<Fp8UpdateOp>(op)) {
      // In place on the fp8 meta parameter: (meta) -> nothing.
      FailureOr<int32_t> p = paramId(op, upd.getParamAttr().getAttr(), 0);
      if (failed(p))
        return failure();
      instr->inputs.push_back(*p);
    } else if (isa<AdamWOp, SGDOp>(op)) {
      // In place: (param, grad, state..., [norm]) -> nothing.
      auto name = op->getAttrOfType<FlatSymbolRefAttr>("param").getAttr();
      FailureOr<int32_t> p = paramId(op, name, 0);
      if (failed(p))
        return failure();
      const ParamIds &pid = paramIds[name];
      unsigned want = isa<AdamWOp>(op) ? 2 : 1;
      if (pid.states.size() != want)
        return op->emitError("plan: parameter @")
               << name.getValue() << " has " << pid.states.size()
               << " optimizer state buffers, this update needs " << want;
      instr->inputs.push_back(pid.param);
      if (failed(push(instr->inputs, op->getOperand(0))))
        return failure();
      instr->inputs.insert(instr->inputs.end(), pid.states.begin(),
                           pid.states.end());
      for (Value extra : op->getOperands().drop_front()) {
        // Several ranks: the executor's global norm replaces the plan's.
        if (dropNorm() && extra.getDefiningOp<GlobalNormOp>())
          continue;
        if (failed(push(instr->inputs, extra)))
          return failure();
      }
    } else {
      for (Value v : op->getOperands())
        if (failed(push(instr->inputs, v)))
          return failure();
      for (Value v : op->getResults())
        if (failed(push(instr->outputs, v)))
          return failure();
    }
    if (failed(addAttrs(op, *instr)))
      return failure();
    if (isa<SendOp, RecvOp>(op))
      resolvePeer(*instr);
    if (isa<ReshapeOp>(op) && mem.aliasOf.count(op->getResult(0))) {
      // A view: the result shares the operand's storage, nothing to copy.
      auto a = std::make_unique<fb::AttrT>();
      a->key = "alias";
      a->kind = fb::AttrKind::Int;
      a->i = 1;
      instr->attrs.push_back(std::move(a));
    }
    if (isa<AdamWOp, SGDOp>(op) && op->hasAttr("mapp.zero_shard") &&
        failed(addZeroRange(op, *instr)))
      return failure();
    if (isa<GradSyncOp>(op))
      resolveStageRanks(*instr);
    block.instrs.push_back(std::move(instr));
    return success();
  }

  /// An optimizer shared by every stage updates only this stage's params.
  bool skipForStage(Operation *op, const StepBlock &b) {
    if (!b.everyStage)
      return false;
    if (isa<ParamGatherOp>(op))
      if (auto st = op->getAttrOfType<IntegerAttr>("mapp.stage"))
        return st.getInt() != mem.stage;
    if (auto ref = op->getAttrOfType<FlatSymbolRefAttr>("param"))
      return !paramIds.count(ref.getAttr());
    return false;
  }

  LogicalResult addBlock(const StepBlock &b) {
    auto block = std::make_unique<fb::BlockT>();
    block->kind = blockKind(b.phase);
    block->chunk = b.chunk;
    Block &body = b.func.getBody().front();
    for (BlockArgument arg : body.getArguments())
      if (step.canonical(arg) == Value(arg) && failed(idOf(arg)))
        return failure();
    for (Operation &op : body) {
      if (isa<ParamRefOp, GradRefOp>(op) || skipForStage(&op, b))
        continue;
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        if (b.hasLoss) {
          FailureOr<int32_t> loss = idOf(ret.getOperand(0));
          if (failed(loss))
            return failure();
          prog.loss = *loss;
          prog.values[*loss]->kind = fb::ValueKind::Loss;
        }
        continue;
      }
      if (isa<GlobalNormOp>(op) && dropNorm())
        continue;
      if (op.getDialect() != op.getContext()->getLoadedDialect<MappDialect>())
        return op.emitError("plan: '")
               << op.getName() << "' has no plan kernel";
      if (failed(addInstr(&op, *block)))
        return failure();
    }
    prog.blocks.push_back(std::move(block));
    return success();
  }

  /// The rank's task table: the (first) schedule op's, or forward/backward
  /// per microbatch in order; the optimizer runs last, once. An adaptive
  /// plan also carries every schedule op's order as a ScheduleTable named
  /// by its kind (the first, "dfc", is Program.tasks too).
  LogicalResult addTasks(llvm::DenseMap<const StepBlock *, int32_t> &index) {
    auto scheds = llvm::to_vector(module.getOps<ScheduleOp>());
    if (scheds.empty())
      return tasksOf(nullptr, index, prog.tasks);
    if (failed(tasksOf(scheds.front(), index, prog.tasks)))
      return failure();
    if (!step.layout.adaptive)
      return success();
    for (ScheduleOp sched : scheds) {
      auto table = std::make_unique<fb::ScheduleTableT>();
      table->name = sched.getKind().str();
      if (failed(tasksOf(sched, index, table->tasks)))
        return failure();
      prog.schedule_tables.push_back(std::move(table));
    }
    return success();
  }

  LogicalResult tasksOf(ScheduleOp sched,
                        llvm::DenseMap<const StepBlock *, int32_t> &index,
                        std::vector<fb::Task> &tasks) {
    auto find = [&](Phase ph, int64_t chunk) -> int32_t {
      for (auto &[b, i] : index)
        if (b->phase == ph && (ph == Phase::Optimizer || b->chunk == chunk))
          return i;
      return -1;
    };
    int64_t mbs = step.layout.microbatches;
    auto push = [&](Phase ph, int64_t chunk, int64_t mb) -> LogicalResult {
      int32_t b = find(ph, chunk);
      if (b < 0)
        return module.emitError("plan: stage ")
               << mem.stage << " has no "
               << (ph == Phase::BackwardInput    ? "backward-input "
                   : ph == Phase::BackwardWeight ? "backward-weight "
                                                 : "")
               << "block for chunk " << chunk
               << (ph == Phase::BackwardInput || ph == Phase::BackwardWeight
                       ? " (split the backward: --mapp-split-backward)"
                       : "");
      tasks.emplace_back(b, (int32_t)mb);
      return success();
    };
    if (sched) {
      if ((int64_t)sched.getTables().size() != step.layout.pp)
        return sched.emitError("plan: schedule has ")
               << sched.getTables().size() << " tables for pp = "
               << step.layout.pp;
      if (sched.getMicrobatchesAttr().getInt() != mbs)
        return sched.emitError("plan: schedule microbatches differ from "
                               "mapp.parallel");
      for (Attribute a : cast<ArrayAttr>(sched.getTables()[mem.stage])) {
        auto t = cast<TaskAttr>(a);
        Phase ph = t.getKind() == TaskKind::Forward    ? Phase::Forward
                   : t.getKind() == TaskKind::Backward ? Phase::Backward
                   : t.getKind() == TaskKind::BackwardInput
                       ? Phase::BackwardInput
                       : Phase::BackwardWeight;
        if (failed(push(ph, t.getChunk(), t.getMicrobatch())))
          return failure();
      }
    } else {
      // A forward-only stage (a MegaFBD forward side) has no backward.
      bool backward = false;
      for (auto &[b, i] : index)
        backward |= b->phase == Phase::Backward;
      for (int64_t mb = 0; mb < mbs; ++mb) {
        for (int64_t c = 0; c < step.layout.chunks; ++c)
          if (failed(push(Phase::Forward, c, mb)))
            return failure();
        for (int64_t c = step.layout.chunks - 1; backward && c >= 0; --c)
          if (failed(push(Phase::Backward, c, mb)))
            return failure();
      }
    }
    if (find(Phase::Optimizer, 0) >= 0)
      return push(Phase::Optimizer, 0, 0);
    return success();
  }

  struct ParamIds {
    int32_t param, grad;
    SmallVector<int32_t, 2> states;
  };
  ModuleOp module;
  const StepStructure &step;
  const StageMemory &mem;
  fb::ProgramT &prog;
  const LayerNames &names; // the module's, read once for all its ranks
  llvm::DenseMap<StringAttr, ParamIds> paramIds;
  llvm::DenseMap<Value, int32_t> ids;
};

/// Model-level fields of the plan from the inputs and the `mapp.model` dict.
void fillModelFields(ModuleOp module, const StepStructure &step,
                     fb::PlanT &plan) {
  auto dict = module->getAttrOfType<DictionaryAttr>("mapp.model");
  auto get = [&](StringRef key) -> int64_t {
    if (dict)
      if (auto a = dict.getAs<IntegerAttr>(key))
        return a.getInt();
    return 0;
  };
  plan.vocab_size = get("vocab_size");
  for (const StepBlock &b : step.blocks)
    for (BlockArgument arg : b.func.getArguments())
      if (auto in = inputRole(b.func, arg.getArgNumber());
          b.phase == Phase::Forward && in && in.getValue() == "tokens") {
        auto shape = cast<RankedTensorType>(arg.getType()).getShape();
        if (shape.size() == 2) {
          plan.micro_batch_size = shape[0];
          plan.seq_length = shape[1];
        }
      }
  // MegaFBD forward sides (nested modules in mapp.subgraph) are sharded at
  // their own degree: read the module's own ops only.
  if (!plan.vocab_size)
    module.walk([&](EmbeddingOp op) {
      if (op->getParentOfType<SubgraphOp>())
        return;
      int64_t rows =
          cast<RankedTensorType>(op.getTable().getType()).getShape()[0];
      // A vocabulary-parallel table holds its tp rank's rows.
      if (auto ref = op.getTable().getDefiningOp<ParamRefOp>())
        if (auto decl = module.lookupSymbol<ParamOp>(ref.getParam()))
          if (auto dim = decl.getShardDimAttr(); dim && dim.getInt() == 0 &&
              (!decl.getShardGroupAttr() || decl.getShardGroupAttr() == "tp"))
            rows *= step.layout.tp;
      plan.vocab_size = rows;
    });
  if (auto trace = module->getAttrOfType<DictionaryAttr>("mapp.trace")) {
    if (auto every = trace.getAs<IntegerAttr>("every"))
      plan.trace_every = every.getInt();
    if (auto window = trace.getAs<IntegerAttr>("window"))
      plan.trace_window = window.getInt();
  }
  module.walk([&](Operation *op) {
    if (isa<AdamWOp>(op))
      plan.optimizer = "adamw";
    else if (isa<SGDOp>(op))
      plan.optimizer = "sgd";
    if (auto mn = op->getAttrOfType<FloatAttr>("max_norm"))
      plan.max_grad_norm = mn.getValueAsDouble();
  });
}

} // namespace

LogicalResult mapp::buildStageProgram(ModuleOp module, const StepStructure &step,
                                      const StageMemory &mem,
                                      fb::ProgramT &prog) {
  return ProgramBuilder(module, step, mem, prog, LayerNames::of(module))
      .build();
}

FailureOr<std::unique_ptr<fb::PlanT>> mapp::buildPlan(ModuleOp module,
                                                       bool aliasReshapes) {
  FailureOr<StepStructure> step = StepStructure::analyze(module);
  if (failed(step))
    return failure();
  const ParallelLayout &l = step->layout;
  auto plan = std::make_unique<fb::PlanT>();
  plan->version = static_cast<uint32_t>(plan::SchemaVersion::Current);
  plan->world_size = l.worldSize();
  plan->tp = l.tp;
  plan->pp = l.pp;
  plan->dp = l.dp;
  plan->ep = l.ep;
  plan->cp = l.cp;
  plan->chunks = l.chunks;
  plan->num_microbatches = l.microbatches;
  plan->schedule = l.schedule;
  if (l.adaptive) {
    plan->adaptive = std::make_unique<fb::AdaptivePolicyT>();
    plan->adaptive->mem_cap_bytes = l.adaptive->memCapBytes;
    plan->adaptive->slow_link_ratio = l.adaptive->slowLinkRatio;
    plan->adaptive->bandwidth_smoothing = l.adaptive->bandwidthSmoothing;
  }
  fillModelFields(module, *step, *plan);

  SmallVector<StageMemory> stages;
  for (int64_t s = 0; s < l.pp; ++s) {
    FailureOr<StageMemory> mem =
        planStageMemory(module, *step, s, aliasReshapes);
    if (failed(mem) || failed(applyMemCap(module, l, *mem)))
      return failure();
    stages.push_back(std::move(*mem));
  }
  const LayerNames names = LayerNames::of(module);
  // Megatron order: tp fastest, then dp, then pp.
  for (int64_t rank = 0; rank < l.worldSize(); ++rank) {
    auto prog = std::make_unique<fb::ProgramT>();
    prog->rank = rank;
    prog->tp = rank % l.tp;
    prog->dp = (rank / l.tp) % l.dp;
    prog->pp = rank / (l.tp * l.dp);
    ProgramBuilder builder(module, *step, stages[prog->pp], *prog, names);
    if (failed(builder.build()))
      return failure();
    plan->programs.push_back(std::move(prog));
  }
  if (module->hasAttr("mapp.fbd") &&
      failed(addFbdPrograms(module, *plan, aliasReshapes)))
    return failure();
  return plan;
}

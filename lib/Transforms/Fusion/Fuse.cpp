// --mapp-fuse (issue 37): groups maximal chains of elementwise ops (and a
// reduce_sum that ends a chain) into mapp.fused ops whose program the
// backends evaluate in one pass over memory (docs/fusion.md). Runs on the
// training graph, after autodiff, so no gradient rule is needed.
//
// Greedy, in program order, per block: a fusible op joins the open group
// of one of its producers when it iterates over the same domain (open
// sibling groups over that domain that load a value it reads merge in); a
// group closes when a value of it is read by an op outside it (a GEMM, a
// collective, a probe, ...), so every value read outside is materialized
// where the unfused graph had it and the fused op, placed at the group's
// last op, precedes every reader. Nothing is duplicated: a value with
// several consumers is one output of its group, never recomputed.
//
// A reduce_sum or reduce_max over the trailing dims (a norm's sum, a
// softmax's max over the row) does not end its group: it gives one value
// per row; ops on that value's shape
// (with or without the row dims kept as 1) join as row statements, the
// reshapes between those shapes and the broadcast back to the domain join
// as views, and ops over the domain reading the broadcast continue the
// group: a norm or a softmax, forward or backward, is one region
// (docs/fusion.md). reduce_max fuses only over the rows.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/rt/FusedProgram.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

#include <functional>

namespace mapp {
#define GEN_PASS_DEF_MAPPFUSE
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;
namespace fz = mapp::rt::fused;

namespace {

ArrayRef<int64_t> shapeOf(Value v) { return cast<RankedTensorType>(v.getType()).getShape(); }

/// The program op of a fusible op (reduce_sum included), or none.
std::optional<fz::Op> programOp(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<fz::Op>>(op)
      .Case([](NegOp) { return fz::Op::Neg; })
      .Case([](AbsOp) { return fz::Op::Abs; })
      .Case([](SignOp) { return fz::Op::Sign; })
      .Case([](ExpOp) { return fz::Op::Exp; })
      .Case([](LogOp) { return fz::Op::Log; })
      .Case([](SqrtOp) { return fz::Op::Sqrt; })
      .Case([](RsqrtOp) { return fz::Op::Rsqrt; })
      .Case([](TanhOp) { return fz::Op::Tanh; })
      .Case([](SinOp) { return fz::Op::Sin; })
      .Case([](CosOp) { return fz::Op::Cos; })
      .Case([](SigmoidOp) { return fz::Op::Sigmoid; })
      .Case([](SiluOp) { return fz::Op::Silu; })
      .Case([](PowOp) { return fz::Op::Pow; })
      .Case([](ScaleOp) { return fz::Op::Scale; })
      .Case([](SoftcapOp) { return fz::Op::Softcap; })
      .Case([](GeluOp) { return fz::Op::Gelu; })
      .Case([](AddOp) { return fz::Op::Add; })
      .Case([](MulOp) { return fz::Op::Mul; })
      .Case([](SubOp) { return fz::Op::Sub; })
      .Case([](DivOp) { return fz::Op::Div; })
      .Case([](MaximumOp) { return fz::Op::Maximum; })
      .Case([](MinimumOp) { return fz::Op::Minimum; })
      .Case([](LtOp) { return fz::Op::Lt; })
      .Case([](LeOp) { return fz::Op::Le; })
      .Case([](GtOp) { return fz::Op::Gt; })
      .Case([](GeOp) { return fz::Op::Ge; })
      .Case([](EqOp) { return fz::Op::Eq; })
      .Case([](NeOp) { return fz::Op::Ne; })
      .Case([](SiluGradOp) { return fz::Op::SiluGrad; })
      .Case([](GeluGradOp) { return fz::Op::GeluGrad; })
      .Case([](SoftcapGradOp) { return fz::Op::SoftcapGrad; })
      .Case([](SelectOp) { return fz::Op::Select; })
      .Case([](ReduceSumOp) { return fz::Op::ReduceSum; })
      .Case([](ReduceMaxOp) { return fz::Op::ReduceMax; })
      .Default([](Operation *) { return std::nullopt; });
}

fz::Stmt statementOf(Operation *op, fz::Op kind) {
  fz::Stmt st;
  st.op = kind;
  if (auto s = dyn_cast<ScaleOp>(op))
    st.imm = s.getFactor().convertToDouble();
  else if (auto p = dyn_cast<PowOp>(op))
    st.imm = p.getExponent().convertToDouble();
  else if (auto c = dyn_cast<SoftcapOp>(op))
    st.imm = c.getCap().convertToDouble();
  else if (auto c = dyn_cast<SoftcapGradOp>(op))
    st.imm = c.getCap().convertToDouble();
  else if (auto g = dyn_cast<GeluOp>(op))
    st.tanh = g.getApproximate() == "tanh";
  else if (auto g = dyn_cast<GeluGradOp>(op))
    st.tanh = g.getApproximate() == "tanh";
  else if (auto r = dyn_cast<ReduceSumOp>(op))
    st.dims.assign(r.getDims().begin(), r.getDims().end());
  else if (auto r = dyn_cast<ReduceMaxOp>(op))
    st.dims.assign(r.getDims().begin(), r.getDims().end());
  return st;
}

/// reduce_sum and reduce_max: the reductions of the program vocabulary.
bool isReduction(Operation *op) { return isa<ReduceSumOp, ReduceMaxOp>(op); }

/// The domain an op iterates over: its operand's shape for a reduction,
/// else its result's.
ArrayRef<int64_t> domainOf(Operation *op) {
  return isReduction(op) ? shapeOf(op->getOperand(0)) : shapeOf(op->getResult(0));
}

/// NumPy's rule (mapp.broadcast's verifier).
bool broadcastsTo(ArrayRef<int64_t> x, ArrayRef<int64_t> domain) {
  if (x.size() > domain.size())
    return false;
  size_t lead = domain.size() - x.size();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != 1 && x[i] != domain[lead + i])
      return false;
  return true;
}

/// An operand as the group loads it: a broadcast of an outside value is
/// looked through (the program loads the value broadcast, the
/// mapp.broadcast op is not run for it).
Value loadedValue(Value v) {
  if (auto b = v.getDefiningOp<BroadcastOp>())
    return b.getX();
  return v;
}

/// Ops cloned by --mapp-recompute carry ".recompute" in their name. A
/// recomputed op never shares a group with an op of the forward (outside a
/// function of phase "backward", one before the block's first recomputed
/// op): the recomputation boundary
/// stays where the policy put it, the value it recomputes from saved, what
/// it recomputes not. With the backward's ops it may (the SwiGLU's silu
/// recomputed inside the kernel of its gradients).
bool isRecomputed(Operation *op) {
  auto n = op->getAttrOfType<StringAttr>("mapp.name");
  return n && n.getValue().ends_with(".recompute");
}

struct Group {
  SmallVector<Operation *> ops;
  SmallVector<int64_t> domain;
  /// The trailing dims its reductions reduce (the rows), 0 before one joins.
  int64_t rowDims = 0;
  bool open = true;
  /// The op outside it that first read one of its values (it closed
  /// then); an elementwise op after it may still join when it could run
  /// before that reader (hoisted: the fused op is placed before it), while
  /// no op with memory effects (a probe, a collective) came since.
  Operation *closedBy = nullptr;
  int closedEpoch = 0;
  bool recomputed = false; // holds a recomputed op
  bool forward = false;    // holds an op before the block's first recomputed op
  Attribute stage;
  /// --mapp-split-backward moves ops tagged mapp.wgrad into the W function:
  /// a region is all tagged or all untagged.
  bool wgrad = false;
  /// The outside values its ops load (its operands once materialized):
  /// at most fz::kMaxInputs, the generated kernels' argument block.
  llvm::SmallSetVector<Value, 8> loads;
};

/// A reduction's dims when they are the domain's trailing dims and leave
/// one dim at least (rows), else 0.
int64_t trailingDims(Operation *r) {
  ArrayRef<int64_t> dims = isa<ReduceSumOp>(r) ? cast<ReduceSumOp>(r).getDims()
                                               : cast<ReduceMaxOp>(r).getDims();
  int64_t rank = shapeOf(r->getOperand(0)).size();
  for (auto [i, d] : llvm::enumerate(dims))
    if (d != rank - static_cast<int64_t>(dims.size() - i))
      return 0;
  return static_cast<int64_t>(dims.size()) < rank ? dims.size() : 0;
}

/// The rows' shape of a group (its domain without the row dims) and the
/// same with the row dims kept as 1.
SmallVector<int64_t> rowShape(const Group &g, bool kept) {
  SmallVector<int64_t> s(g.domain.begin(), g.domain.end() - g.rowDims);
  if (kept)
    s.append(g.rowDims, 1);
  return s;
}

/// A value of this shape holds one value per row of g.
bool isRowShape(ArrayRef<int64_t> shape, const Group &g) {
  return g.rowDims && ArrayRef<int64_t>(g.domain) != shape &&
         (shape == ArrayRef<int64_t>(rowShape(g, false)) ||
          shape == ArrayRef<int64_t>(rowShape(g, true)));
}

bool isView(Operation *op) { return isa<ReshapeOp, BroadcastOp>(op); }

/// The op producing v when v is its only use's operand (the epilogue rules
/// below need the GEMM's result read by the epilogue op alone).
template <typename OpT> OpT soleProducer(Value v) {
  auto def = v.getDefiningOp<OpT>();
  return def && v.hasOneUse() ? def : OpT();
}

/// An op the CUDA backend runs inside a library call's epilogue rather than
/// as a kernel of its own (runtime/src/backend/cuda/Fusion.cu,
/// planFusions): a region taking it would trade a free epilogue for a
/// pass over memory and force the GEMM to write what the epilogue never
/// stored. Left out of regions (the cost model's first rule: an op a
/// neighbouring GEMM absorbs costs no bytes):
///  - tanh GELU of a linear's result (cuBLASLt GELU_AUX_BIAS);
///  - the add of a linear's result and a residual (the GEMM's beta = 1);
///  - tanh gelu_grad of an input-gradient matmul (cuBLASLt DGELU);
///  - the add of a norm gradient and a residual gradient (the norm
///    gradient kernel's output);
///  - a bias gradient: the sum over all but the last dim of a weight
///    gradient matmul's dy, or of what dy is a reshape of (BGRADB).
bool absorbedByGemmEpilogue(Operation *op) {
  if (auto g = dyn_cast<GeluOp>(op))
    return g.getApproximate() == "tanh" && soleProducer<LinearOp>(g.getX());
  if (auto g = dyn_cast<GeluGradOp>(op)) {
    auto mm = soleProducer<MatmulOp>(g.getDy());
    return g.getApproximate() == "tanh" && mm && !mm.getTransposeA();
  }
  if (auto add = dyn_cast<AddOp>(op)) {
    if (add->getNumOperands() != 2 || shapeOf(add->getOperand(0)) != shapeOf(add->getOperand(1)))
      return false;
    return llvm::any_of(add->getOperands(), [](Value v) {
      Operation *def = v.getDefiningOp();
      bool normGrad = isa_and_nonnull<LayerNormGradOp, RMSNormGradOp>(def) &&
                      cast<OpResult>(v).getResultNumber() == 0;
      return v.hasOneUse() && (isa_and_nonnull<LinearOp>(def) || normGrad);
    });
  }
  if (auto sum = dyn_cast<ReduceSumOp>(op)) {
    Value y = sum.getX();
    int64_t rank = shapeOf(y).size();
    ArrayRef<int64_t> dims = sum.getDims();
    bool allButLast = rank >= 2 && static_cast<int64_t>(dims.size()) == rank - 1;
    for (size_t d = 0; allButLast && d < dims.size(); ++d)
      allButLast = dims[d] == static_cast<int64_t>(d);
    if (!allButLast)
      return false;
    // dy itself or its row-major reshape to [rows, columns].
    SmallVector<Value, 2> dys = {y};
    for (Operation *user : y.getUsers())
      if (auto r = dyn_cast<ReshapeOp>(user))
        dys.push_back(r.getResult());
    return llvm::any_of(dys, [](Value dy) {
      return llvm::any_of(dy.getUsers(), [&](Operation *user) {
        auto mm = dyn_cast<MatmulOp>(user);
        return mm && mm.getTransposeA() && !mm.getTransposeB() && mm.getA() == dy;
      });
    });
  }
  return false;
}

struct FusePass : mapp::impl::MappFuseBase<FusePass> {
  using MappFuseBase::MappFuseBase;

  void runOnOperation() override {
    SmallVector<Block *> blocks;
    getOperation()->walk([&](Block *b) { blocks.push_back(b); });
    for (Block *b : blocks)
      fuseBlock(*b);
  }

  /// The block's first recomputed op (null: none, or the block is of a
  /// backward function): ops before it are the forward's.
  Operation *firstRecomputed = nullptr;
  /// Ops with memory effects met so far in the block: nothing is hoisted
  /// across one.
  int effectEpoch = 0;

  bool isForward(Operation *op) const {
    return firstRecomputed && op->isBeforeInBlock(firstRecomputed);
  }

  bool sameKind(const Group &a, Operation *op) const {
    return (isRecomputed(op) ? !a.forward : !(a.recomputed && isForward(op))) &&
           a.stage == op->getAttr("mapp.stage") && a.wgrad == op->hasAttr("mapp.wgrad");
  }

  /// Group h can merge into g: the same domain and rows, or h is a chain
  /// over g's rows (its ops become row statements). A group of the forward
  /// never merges with one holding a recomputed op.
  static bool mergeable(const Group &h, const Group &g) {
    if (!h.open || !g.open || (h.recomputed && g.forward) || (g.recomputed && h.forward) ||
        h.stage != g.stage || h.wgrad != g.wgrad)
      return false;
    if (h.domain == g.domain)
      return !h.rowDims || !g.rowDims || h.rowDims == g.rowDims;
    return !h.rowDims && isRowShape(h.domain, g) &&
           llvm::none_of(h.ops, isReduction);
  }

  /// How many of the latest groups an op looks through for a sibling.
  static constexpr int kSiblingWindow = 8;

  /// Whether op reads a value group g loads.
  static bool sharesLoad(const Group &g, Operation *op) {
    return llvm::any_of(op->getOperands(),
                        [&](Value v) { return g.loads.contains(loadedValue(v)); });
  }

  /// Whether elementwise op, after the reader that closed group g, can join
  /// g: every value it loads is defined before that reader, so it can run
  /// there (the backward's silu_grad of the product gradient whose sibling
  /// a GEMM read first).
  bool hoistsInto(Operation *op, const Group &g, const std::function<int(Value)> &groupOfValue,
                  int gi) const {
    auto before = [&](Value v) {
      Operation *def = v.getDefiningOp();
      return !def || def->getBlock() != g.closedBy->getBlock() ||
             def->isBeforeInBlock(g.closedBy);
    };
    return g.closedBy && g.closedEpoch == effectEpoch && !g.ops.empty() && !g.rowDims &&
           !isView(op) && !isReduction(op) &&
           llvm::all_of(op->getOperands(), [&](Value v) {
             return groupOfValue(v) == gi || before(loadedValue(v));
           });
  }

  /// Whether op (fusible or a view) can join group g, whose values it reads.
  bool canJoin(Operation *op, const Group &g, const std::function<int(Value)> &groupOfValue,
               int gi) {
    if (!sameKind(g, op) || !(g.open || hoistsInto(op, g, groupOfValue, gi)))
      return false;
    auto ownRowValue = [&](Value v) {
      return groupOfValue(v) == gi && isRowShape(shapeOf(v), g);
    };
    if (isView(op)) { // a reshape between the rows' shapes, a broadcast back to the domain
      Value x = op->getOperand(0);
      ArrayRef<int64_t> out = shapeOf(op->getResult(0));
      return ownRowValue(x) &&
             (isa<ReshapeOp>(op) ? isRowShape(out, g)
                                 : out == ArrayRef<int64_t>(g.domain) &&
                                       shapeOf(x) == ArrayRef<int64_t>(rowShape(g, true)));
    }
    if (isReduction(op)) { // reduce_max only over the rows (a row program)
      if (shapeOf(op->getOperand(0)) != ArrayRef<int64_t>(g.domain))
        return false;
      int64_t m = trailingDims(op);
      return m ? !g.rowDims || g.rowDims == m : !g.rowDims && isa<ReduceSumOp>(op);
    }
    ArrayRef<int64_t> out = shapeOf(op->getResult(0));
    if (out == ArrayRef<int64_t>(g.domain)) // every operand read per element
      return llvm::all_of(op->getOperands(), [&](Value v) {
        return groupOfValue(v) == gi ? shapeOf(v) == out
                                     : broadcastsTo(shapeOf(loadedValue(v)), out) ||
                                           broadcastsTo(shapeOf(v), out);
      });
    if (!isRowShape(out, g)) // a row statement: row values and operands per row
      return false;
    return llvm::all_of(op->getOperands(), [&](Value v) {
      return groupOfValue(v) == gi ? ownRowValue(v) : broadcastsTo(shapeOf(v), out);
    });
  }

  /// The outside values g would load with op (and group `merging`, -1 for
  /// none) in it: a region stays within the fused program's operand limit.
  template <typename GroupOf>
  static size_t loadsWith(const std::vector<Group> &groups, int gi, Operation *op, int merging,
                          GroupOf &groupOfValue) {
    llvm::SmallSetVector<Value, 8> loads = groups[gi].loads;
    auto add = [&](Value v) {
      int g = groupOfValue(v);
      if (g != gi && (merging < 0 || g != merging))
        loads.insert(loadedValue(v));
    };
    for (Value v : op->getOperands())
      add(v);
    if (merging >= 0)
      for (Value v : groups[merging].loads)
        add(v);
    return loads.size();
  }

  void fuseBlock(Block &block) {
    // A dead op reading a group value would end the group (the eps
    // gradient of a norm's backward): gone first.
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block)))
      if ((programOp(&op) || isView(&op)) && isOpTriviallyDead(&op))
        op.erase();
    firstRecomputed = nullptr;
    effectEpoch = 0;
    auto func = block.getParentOp()->getParentOfType<func::FuncOp>();
    if (auto f = dyn_cast<func::FuncOp>(block.getParentOp()))
      func = f;
    auto phase = func ? func->getAttrOfType<StringAttr>("mapp.phase") : StringAttr();
    if (!phase || phase.getValue() != "backward")
      for (Operation &op : block)
        if (isRecomputed(&op)) {
          firstRecomputed = &op;
          break;
        }
    std::vector<Group> groups;
    DenseMap<Operation *, int> groupOf;
    std::function<int(Value)> groupOfValue = [&](Value v) -> int {
      Operation *def = v.getDefiningOp();
      if (!def || def->getBlock() != &block)
        return -1;
      auto it = groupOf.find(def);
      return it == groupOf.end() ? -1 : it->second;
    };

    for (Operation &opRef : block) {
      Operation *op = &opRef;
      int joined = -1;
      std::optional<fz::Op> kind = programOp(op);
      if (kind && keepEpilogues && absorbedByGemmEpilogue(op))
        kind.reset();
      bool view = isView(op);
      if ((kind || view) && op->getNumResults() == 1 && op->getNumRegions() == 0) {
        // A group with rows first: a row op reading a norm's row value and
        // a chain over the rows joins the norm (the chain merges into it).
        for (int pass = 0; pass < 2 && joined < 0; ++pass)
          for (Value v : op->getOperands()) {
            int g = groupOfValue(v);
            if (g >= 0 && (pass || groups[g].rowDims) && canJoin(op, groups[g], groupOfValue, g) &&
                loadsWith(groups, g, op, -1, groupOfValue) <= fz::kMaxInputs) {
              joined = g;
              break;
            }
          }
        ArrayRef<int64_t> domain = kind ? domainOf(op) : ArrayRef<int64_t>();
        if (joined >= 0) {
          groups[joined].ops.push_back(op);
          groups[joined].recomputed |= isRecomputed(op);
          groups[joined].forward |= isForward(op);
          auto mergeIn = [&](int h) {
            if (groups[h].domain == groups[joined].domain)
              groups[joined].rowDims = std::max(groups[joined].rowDims, groups[h].rowDims);
            for (Operation *m : groups[h].ops) {
              groups[joined].ops.push_back(m);
              groupOf[m] = joined;
            }
            groups[joined].recomputed |= groups[h].recomputed;
            groups[joined].forward |= groups[h].forward;
            for (Value v : groups[h].loads)
              groups[joined].loads.insert(v);
            groups[joined].loads.remove_if([&](Value v) { return groupOfValue(v) == joined; });
            groups[h].ops.clear();
            groups[h].open = false;
          };
          // Other open groups this op reads merge into its group (two
          // products summed: one region): they had no reader outside.
          for (Value v : op->getOperands()) {
            int h = groupOfValue(v);
            if (h >= 0 && h != joined && mergeable(groups[h], groups[joined]) &&
                loadsWith(groups, joined, op, h, groupOfValue) <= fz::kMaxInputs)
              mergeIn(h);
          }
          // So do open siblings over its domain loading a value it reads (a
          // product's two gradients: dy read once). Only here, where the op
          // continues a chain: an op starting one does not join a sibling,
          // which a reduction may close before the op's chain goes on (a
          // norm's gain gradient beside its input gradient).
          if (kind && !isReduction(op))
            for (int h = static_cast<int>(groups.size()) - 1, seen = 0;
                 h >= 0 && seen < kSiblingWindow; --h, ++seen)
              if (h != joined && groups[h].open && !groups[h].rowDims && !groups[joined].rowDims &&
                  groups[h].domain == groups[joined].domain && sharesLoad(groups[h], op) &&
                  mergeable(groups[h], groups[joined]) &&
                  loadsWith(groups, joined, op, h, groupOfValue) <= fz::kMaxInputs)
                mergeIn(h);
        } else if (kind && (!isReduction(op) || trailingDims(op)) &&
                   domain.size() <= static_cast<size_t>(fz::kMaxRank) &&
                   llvm::all_of(op->getOperands(), [&](Value v) {
                     return broadcastsTo(shapeOf(loadedValue(v)), domain) ||
                            broadcastsTo(shapeOf(v), domain);
                   })) {
          // A sum over other dims alone is already one pass; it only ends
          // chains. A sum or max over the rows may start a row program (a
          // LayerNorm's mean of its input, a softmax's max).
          Group g;
          g.ops.push_back(op);
          g.domain.assign(domain.begin(), domain.end());
          g.recomputed = isRecomputed(op);
          g.forward = isForward(op);
          g.stage = op->getAttr("mapp.stage");
          g.wgrad = op->hasAttr("mapp.wgrad");
          groups.push_back(std::move(g));
          joined = groups.size() - 1;
        }
        if (joined >= 0) {
          groupOf[op] = joined;
          for (Value v : op->getOperands())
            if (groupOfValue(v) != joined)
              groups[joined].loads.insert(loadedValue(v));
          if (isReduction(op)) {
            // Over the rows: the group goes on (a row program); otherwise
            // the reduction ends it.
            groups[joined].rowDims = trailingDims(op);
            if (!groups[joined].rowDims)
              groups[joined].open = false;
          }
        }
      }
      // A group value read outside its group (here or in a nested region)
      // must be materialized: the group takes no op after this reader.
      op->walk([&](Operation *inner) {
        for (Value v : inner->getOperands()) {
          int g = groupOfValue(v);
          if (g >= 0 && g != joined && groups[g].open) {
            groups[g].open = false;
            // Hoisting places the region before its reader: not before one
            // that is itself fused (erased when its region is made).
            groups[g].closedBy = joined < 0 ? op : nullptr;
            groups[g].closedEpoch = effectEpoch;
          }
        }
      });
      if (!isMemoryEffectFree(op))
        ++effectEpoch;
    }
    for (Group &g : groups)
      if (llvm::count_if(g.ops, [](Operation *o) { return !isView(o); }) >= 2)
        materialize(g);
  }

  void materialize(Group &g) {
    llvm::sort(g.ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    llvm::SmallPtrSet<Operation *, 16> members(g.ops.begin(), g.ops.end());
    fz::Program prog;
    // Operands, keyed by value and whether row statements read them.
    llvm::MapVector<std::pair<Value, unsigned>, int> inputs;
    DenseMap<Value, int> stmtOf;
    llvm::MapVector<Value, int64_t> outputs; // value read outside -> statement
    SmallVector<Operation *> keptViews;      // broadcasts read outside: kept
    llvm::SetVector<Operation *> lookedThrough;
    SmallVector<Operation *> madeLoads; // per-row reshapes of operands
    auto readOutside = [&](Value v) {
      return llvm::any_of(v.getUsers(), [&](Operation *u) { return !members.contains(u); });
    };
    Operation *last = g.ops.back();
    OpBuilder b(g.closedBy && g.closedBy->isBeforeInBlock(last) ? g.closedBy : last);
    SmallVector<int64_t> kept = rowShape(g, true);
    for (Operation *op : g.ops) {
      Value result = op->getResult(0);
      if (isView(op)) { // the same statement, seen in another shape
        Value x = op->getOperand(0);
        stmtOf[result] = stmtOf.lookup(x);
        if (!readOutside(result))
          continue;
        if (isa<ReshapeOp>(op)) { // a row shape: a result of its own
          outputs.insert({result, stmtOf[result]});
        } else { // the domain's shape: the row value is stored, the broadcast kept
          outputs.insert({x, stmtOf[x]});
          keptViews.push_back(op);
        }
        continue;
      }
      fz::Stmt st = statementOf(op, *programOp(op));
      st.row = !isReduction(op) && isRowShape(shapeOf(result), g);
      for (auto [a, v] : llvm::enumerate(op->getOperands())) {
        if (auto it = stmtOf.find(v); it != stmtOf.end()) {
          st.args[a] = fz::Ref{false, it->second};
          continue;
        }
        Value load = v;
        if (st.row) {
          // Read per row: with the row dims kept as 1 (a [B, T] value of a
          // [B, T, C] domain becomes [B, T, 1]).
          if (!broadcastsTo(shapeOf(v), kept)) {
            SmallVector<int64_t> s(shapeOf(v));
            s.append(g.rowDims, 1);
            auto t = cast<RankedTensorType>(v.getType());
            load = b.create<ReshapeOp>(op->getLoc(), RankedTensorType::get(s, t.getElementType()),
                                       v);
            madeLoads.push_back(load.getDefiningOp());
          }
        } else if (!broadcastsTo(shapeOf(v), g.domain) || v.getDefiningOp<BroadcastOp>()) {
          load = loadedValue(v);
          if (load != v)
            lookedThrough.insert(v.getDefiningOp());
        }
        if (auto it = stmtOf.find(load); it != stmtOf.end()) {
          st.args[a] = fz::Ref{false, it->second}; // an identity broadcast
          continue;
        }
        auto [it, inserted] =
            inputs.insert({{load, st.row ? 1u : 0u}, static_cast<int>(inputs.size())});
        st.args[a] = fz::Ref{true, it->second};
      }
      int index = prog.stmts.size();
      prog.stmts.push_back(std::move(st));
      stmtOf[result] = index;
      if (readOutside(result))
        outputs.insert({result, index});
    }
    // A value read per element and per row is two operands, and every value
    // read outside is an output: a region over the limits stays unfused.
    if (outputs.empty() || inputs.size() > static_cast<size_t>(fz::kMaxInputs) ||
        outputs.size() > static_cast<size_t>(fz::kMaxOutputs)) {
      for (Operation *op : madeLoads)
        op->erase();
      return; // (no outputs: a dead chain, left to DCE)
    }
    SmallVector<Value> operands;
    for (auto &[key, i] : inputs)
      operands.push_back(key.first);
    SmallVector<Type> types;
    SmallVector<int64_t> outputStmts;
    for (auto &[v, k] : outputs) {
      types.push_back(v.getType());
      outputStmts.push_back(k);
    }
    auto fused = b.create<FusedOp>(last->getLoc(), types, operands,
                                   b.getStringAttr(fz::print(prog)),
                                   b.getDenseI64ArrayAttr(g.domain),
                                   b.getDenseI64ArrayAttr(outputStmts));
    // The placement attributes (stage, layer, name) of the group's last op.
    for (NamedAttribute na : last->getDiscardableAttrs())
      fused->setAttr(na.getName(), na.getValue());
    for (auto [o, r] : llvm::zip(outputs, fused.getValues()))
      o.first.replaceAllUsesWith(r);
    for (Operation *op : llvm::reverse(keptViews))
      op->moveAfter(fused);
    for (Operation *op : llvm::reverse(g.ops))
      if (!llvm::is_contained(keptViews, op))
        op->erase();
    for (Operation *op : lookedThrough)
      if (op->use_empty())
        op->erase();
  }
};

} // namespace

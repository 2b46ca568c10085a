// --mapp-fuse (issue 37): groups maximal chains of elementwise ops (and a
// reduce_sum that ends a chain) into mapp.fused ops whose program the
// backends evaluate in one pass over memory (docs/fusion.md). Runs on the
// training graph, after autodiff, so no gradient rule is needed.
//
// Greedy, in program order, per block: a fusible op joins the open group
// of one of its producers when it iterates over the same domain; a group
// closes when a value of it is read by an op outside it (a GEMM, a
// collective, a probe, ...), so every value read outside is materialized
// where the unfused graph had it and the fused op, placed at the group's
// last op, precedes every reader. Nothing is duplicated: a value with
// several consumers is one output of its group, never recomputed.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/rt/FusedProgram.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

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
  return st;
}

/// The domain an op iterates over: its operand's shape for reduce_sum, else
/// its result's.
ArrayRef<int64_t> domainOf(Operation *op) {
  return isa<ReduceSumOp>(op) ? shapeOf(op->getOperand(0)) : shapeOf(op->getResult(0));
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

/// Ops cloned by --mapp-recompute carry ".recompute" in their name: a
/// recomputed op never shares a group with one that is not (the
/// recomputation boundary stays where the policy put it).
bool isRecomputed(Operation *op) {
  auto n = op->getAttrOfType<StringAttr>("mapp.name");
  return n && n.getValue().ends_with(".recompute");
}

struct Group {
  SmallVector<Operation *> ops;
  SmallVector<int64_t> domain;
  bool open = true;
  bool recomputed = false;
  Attribute stage;
  /// --mapp-split-backward moves ops tagged mapp.wgrad into the W function:
  /// a region is all tagged or all untagged.
  bool wgrad = false;
};

struct FusePass : mapp::impl::MappFuseBase<FusePass> {
  using MappFuseBase::MappFuseBase;

  void runOnOperation() override {
    SmallVector<Block *> blocks;
    getOperation()->walk([&](Block *b) { blocks.push_back(b); });
    for (Block *b : blocks)
      fuseBlock(*b);
  }

  static bool compatible(const Group &a, const Group &b) {
    return a.open && b.open && a.domain == b.domain && a.recomputed == b.recomputed &&
           a.stage == b.stage && a.wgrad == b.wgrad;
  }

  void fuseBlock(Block &block) {
    std::vector<Group> groups;
    DenseMap<Operation *, int> groupOf;
    auto groupOfValue = [&](Value v) -> int {
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
      if (kind && op->getNumResults() == 1 && op->getNumRegions() == 0) {
        ArrayRef<int64_t> domain = domainOf(op);
        // Every operand must be a group value or a load that broadcasts to
        // the domain.
        bool loadable = llvm::all_of(op->getOperands(), [&](Value v) {
          return broadcastsTo(shapeOf(loadedValue(v)), domain) ||
                 broadcastsTo(shapeOf(v), domain);
        });
        for (Value v : op->getOperands()) {
          int g = groupOfValue(v);
          if (!loadable || g < 0)
            continue;
          Group &grp = groups[g];
          if (grp.open && ArrayRef<int64_t>(grp.domain) == domain &&
              grp.recomputed == isRecomputed(op) && grp.stage == op->getAttr("mapp.stage") &&
              grp.wgrad == op->hasAttr("mapp.wgrad")) {
            joined = g;
            break;
          }
        }
        if (joined >= 0) {
          groups[joined].ops.push_back(op);
          // Other open groups this op reads merge into its group (two
          // products summed: one region): they had no reader outside.
          for (Value v : op->getOperands()) {
            int h = groupOfValue(v);
            if (h < 0 || h == joined || !compatible(groups[h], groups[joined]))
              continue;
            for (Operation *m : groups[h].ops) {
              groups[joined].ops.push_back(m);
              groupOf[m] = joined;
            }
            groups[h].ops.clear();
            groups[h].open = false;
          }
        } else if (loadable && !isa<ReduceSumOp>(op)) {
          // A reduce_sum alone is already one pass; it only ends chains.
          groups.push_back(Group{{op}, SmallVector<int64_t>(domain), true, isRecomputed(op),
                                 op->getAttr("mapp.stage"), op->hasAttr("mapp.wgrad")});
          joined = groups.size() - 1;
        }
        if (joined >= 0) {
          groupOf[op] = joined;
          if (isa<ReduceSumOp>(op))
            groups[joined].open = false; // a reduction ends its group
        }
      }
      // A group value read outside its group (here or in a nested region)
      // must be materialized: the group takes no op after this reader.
      op->walk([&](Operation *inner) {
        for (Value v : inner->getOperands()) {
          int g = groupOfValue(v);
          if (g >= 0 && g != joined)
            groups[g].open = false;
        }
      });
    }
    for (Group &g : groups)
      if (g.ops.size() >= 2)
        materialize(g);
  }

  void materialize(Group &g) {
    llvm::sort(g.ops, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
    llvm::SmallPtrSet<Operation *, 16> members(g.ops.begin(), g.ops.end());
    fz::Program prog;
    llvm::MapVector<Value, int> inputs;
    DenseMap<Value, int> stmtOf;
    SmallVector<Value> outputs;
    SmallVector<int64_t> outputStmts;
    llvm::SetVector<Operation *> lookedThrough;
    for (Operation *op : g.ops) {
      fz::Stmt st = statementOf(op, *programOp(op));
      for (auto [a, v] : llvm::enumerate(op->getOperands())) {
        if (auto it = stmtOf.find(v); it != stmtOf.end()) {
          st.args[a] = fz::Ref{false, it->second};
          continue;
        }
        Value load = v;
        if (!broadcastsTo(shapeOf(v), g.domain) || v.getDefiningOp<BroadcastOp>()) {
          load = loadedValue(v);
          if (load != v)
            lookedThrough.insert(v.getDefiningOp());
        }
        if (auto it = stmtOf.find(load); it != stmtOf.end()) {
          st.args[a] = fz::Ref{false, it->second}; // an identity broadcast
          continue;
        }
        auto [it, inserted] = inputs.insert({load, static_cast<int>(inputs.size())});
        st.args[a] = fz::Ref{true, it->second};
      }
      int index = prog.stmts.size();
      prog.stmts.push_back(std::move(st));
      Value result = op->getResult(0);
      stmtOf[result] = index;
      if (llvm::any_of(result.getUsers(), [&](Operation *u) { return !members.contains(u); })) {
        outputs.push_back(result);
        outputStmts.push_back(index);
      }
    }
    if (outputs.empty())
      return; // a dead chain: leave it to DCE
    Operation *last = g.ops.back();
    OpBuilder b(last);
    SmallVector<Value> operands;
    for (auto &[v, i] : inputs)
      operands.push_back(v);
    SmallVector<Type> types;
    for (Value v : outputs)
      types.push_back(v.getType());
    auto fused = b.create<FusedOp>(last->getLoc(), types, operands,
                                   b.getStringAttr(fz::print(prog)),
                                   b.getDenseI64ArrayAttr(g.domain),
                                   b.getDenseI64ArrayAttr(outputStmts));
    // The placement attributes (stage, layer, name) of the group's last op.
    for (NamedAttribute na : last->getDiscardableAttrs())
      fused->setAttr(na.getName(), na.getValue());
    for (auto [v, r] : llvm::zip(outputs, fused.getValues()))
      v.replaceAllUsesWith(r);
    for (Operation *op : llvm::reverse(g.ops))
      op->erase();
    for (Operation *op : lookedThrough)
      if (op->use_empty())
        op->erase();
  }
};

} // namespace

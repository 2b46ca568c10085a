// --mapp-fuse-report: what each mapp.fused region saves (docs/fusion.md).
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"
#include "mapp/cost/CostModel.h"
#include "mapp/rt/FusedProgram.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include "llvm/Support/Format.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPFUSEREPORT
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;
namespace fz = mapp::rt::fused;

namespace {

int64_t elements(Type t) { return cast<RankedTensorType>(t).getNumElements(); }

int64_t elementBytes(Type t) {
  return (cast<RankedTensorType>(t).getElementTypeBitWidth() + 7) / 8;
}

int64_t bytesOf(Type t) { return elements(t) * elementBytes(t); }

struct Saving {
  int64_t unfusedBytes = 0, fusedBytes = 0, unfusedLaunches = 0,
          regions = 0, statements = 0;
  void add(const Saving &o) {
    unfusedBytes += o.unfusedBytes;
    fusedBytes += o.fusedBytes;
    unfusedLaunches += o.unfusedLaunches;
    regions += o.regions;
    statements += o.statements;
  }
};

/// The unfused ops' traffic and launches against the region's, and its
/// statements' names.
Saving measure(FusedOp op, fz::Program &prog, std::string &names) {
  Saving s;
  s.regions = 1;
  ArrayRef<int64_t> domain = op.getDomain();
  const int64_t n = ShapedType::getNumElements(domain);
  const int64_t inner =
      ShapedType::getNumElements(domain.take_back(prog.rowDims));
  const int64_t rows = n / std::max<int64_t>(inner, 1);
  const int64_t es = elementBytes(op.getValues()[0].getType());
  std::vector<int64_t> count(prog.stmts.size());
  for (size_t k = 0; k < prog.stmts.size(); ++k) {
    const fz::Stmt &st = prog.stmts[k];
    count[k] = prog.rowValue(k) ? rows : n;
    if (st.op == fz::Op::ReduceSum && !prog.rowDims) {
      count[k] = n;
      for (int64_t d : st.dims)
        count[k] /= op.getDomain()[d];
    }
    // An operand: a statement's value at its count, an input at its own
    // size (the unfused add or mul reads a bias so).
    int64_t read = 0;
    for (int a = 0; a < fz::info(st.op).arity; ++a) {
      const fz::Ref r = st.args[a];
      read += r.input ? elements(op.getInputs()[r.index].getType())
                      : count[r.index];
    }
    s.unfusedBytes += (read + count[k]) * es;
    names += (k ? ", " : "") + std::string(st.row ? "row " : "") +
             fz::info(st.op).name;
  }
  s.statements = s.unfusedLaunches = prog.stmts.size();
  for (Value in : op.getInputs())
    s.fusedBytes += bytesOf(in.getType());
  for (Value v : op.getValues())
    s.fusedBytes += bytesOf(v.getType());
  return s;
}

struct FuseReportPass : mapp::impl::MappFuseReportBase<FuseReportPass> {
  using Base::Base;

  std::string line(const Saving &s, const cost::Profile *p) const {
    std::string out;
    llvm::raw_string_ostream os(out);
    const int64_t saved = s.unfusedBytes - s.fusedBytes;
    os << "unfused " << s.unfusedBytes << " B in " << s.unfusedLaunches
       << " launches, fused " << s.fusedBytes << " B in " << s.regions
       << ": saves " << saved << " B ("
       << llvm::format("%.0f", 100.0 * saved / std::max<int64_t>(1, s.unfusedBytes))
       << "%) and " << s.unfusedLaunches - s.regions << " launches";
    if (p)
      os << ", ~"
         << llvm::format("%.2f", saved / (p->memGBps * 1e3) +
                                     (s.unfusedLaunches - s.regions) *
                                         p->opOverheadUs)
         << " us with the profile";
    return out;
  }

  void runOnOperation() override {
    cost::Profile prof;
    const cost::Profile *p = nullptr;
    if (!profile.empty()) {
      std::string err;
      if (!cost::loadProfile(profile, prof, &err)) {
        mlir::emitError(getOperation().getLoc(), "--mapp-fuse-report: ") << err;
        return signalPassFailure();
      }
      p = &prof;
    }
    Saving total;
    bool failed = false;
    getOperation().walk([&](func::FuncOp fn) {
      Saving inFn;
      fn.walk([&](FusedOp op) {
        fz::Program prog;
        std::string err =
            fz::parse(op.getProgram().str(), op.getInputs().size(), prog);
        if (!err.empty()) {
          op.emitError("--mapp-fuse-report: ") << err;
          failed = true;
          return;
        }
        std::string names;
        Saving s = measure(op, prog, names);
        auto name = op->getAttrOfType<StringAttr>("mapp.name");
        mlir::emitRemark(op.getLoc(), "fuse: ")
            << (name ? name.getValue() : StringRef("(unnamed)")) << ": "
            << s.statements << " ops (" << names << ") over ["
            << llvm::make_range(op.getDomain().begin(), op.getDomain().end())
            << "]: " << line(s, p);
        inFn.add(s);
      });
      if (inFn.regions)
        mlir::emitRemark(fn.getLoc(), "fuse: @")
            << fn.getSymName() << ": " << inFn.regions << " regions of "
            << inFn.statements << " ops: " << line(inFn, p);
      total.add(inFn);
    });
    if (failed)
      return signalPassFailure();
    mlir::emitRemark(getOperation().getLoc(), "fuse: module: ")
        << total.regions << " regions of " << total.statements
        << " ops: " << line(total, p);
  }
};

} // namespace

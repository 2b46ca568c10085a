// mapp.fused (MappFusedOps.td): the verifier checks the program against the
// operands and results with the parser the runtime uses
// (mapp/rt/FusedProgram.h), so a plan never carries a body the backends
// would reject.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/rt/FusedProgram.h"

using namespace mlir;
using namespace mapp;

namespace {

/// NumPy's rule: `x`'s dims align with the domain's trailing dims, each equal
/// or 1.
bool broadcastsTo(ArrayRef<int64_t> x, ArrayRef<int64_t> domain) {
  if (x.size() > domain.size())
    return false;
  size_t lead = domain.size() - x.size();
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != 1 && x[i] != domain[lead + i])
      return false;
  return true;
}

} // namespace

LogicalResult FusedOp::verify() {
  namespace fz = mapp::rt::fused;
  fz::Program prog;
  std::string err = fz::parse(getProgram().str(), getInputs().size(), prog);
  if (!err.empty())
    return emitOpError("program: ") << err;
  ArrayRef<int64_t> domain = getDomain();
  for (auto [i, v] : llvm::enumerate(getInputs()))
    if (!broadcastsTo(cast<RankedTensorType>(v.getType()).getShape(), domain))
      return emitOpError("operand ") << i << " of type " << v.getType()
                                     << " does not broadcast to the domain ["
                                     << domain << "]";
  ArrayRef<int64_t> outputs = getOutputs();
  if (outputs.size() != getValues().size())
    return emitOpError("has ") << getValues().size() << " results but "
                               << outputs.size() << " outputs";
  const fz::Stmt *reduce = prog.reduction();
  SmallVector<int64_t> reducedShape;
  if (reduce) {
    for (int64_t d : reduce->dims)
      if (d >= static_cast<int64_t>(domain.size()))
        return emitOpError("reduce_sum dim ") << d << " is outside the domain ["
                                               << domain << "]";
    for (auto [d, size] : llvm::enumerate(domain))
      if (!llvm::is_contained(reduce->dims, static_cast<int64_t>(d)))
        reducedShape.push_back(size);
  }
  for (auto [k, stmt] : llvm::enumerate(outputs)) {
    if (stmt < 0 || stmt >= static_cast<int64_t>(prog.stmts.size()))
      return emitOpError("output ") << k << " names statement " << stmt
                                    << ", the program has " << prog.stmts.size();
    bool reduced = reduce && stmt + 1 == static_cast<int64_t>(prog.stmts.size());
    ArrayRef<int64_t> want = reduced ? ArrayRef<int64_t>(reducedShape) : domain;
    auto t = cast<RankedTensorType>(getValues()[k].getType());
    if (t.getShape() != want)
      return emitOpError("result ") << k << " of type " << t << " must have shape ["
                                    << want << "] (statement " << stmt << ")";
  }
  return success();
}

uint64_t FusedOp::getFlops() {
  int64_t n = 1;
  for (int64_t d : getDomain())
    n *= d;
  namespace fz = mapp::rt::fused;
  fz::Program prog;
  fz::parse(getProgram().str(), getInputs().size(), prog);
  return n * prog.stmts.size();
}

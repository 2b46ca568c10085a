// mapp.fused (MappFusedOps.td): the verifier checks the program against the
// operands and results with the parser the runtime uses
// (mapp/rt/FusedProgram.h), so a plan never carries a body the backends
// would reject.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/rt/FusedProgram.h"

using namespace mlir;
using namespace mapp;

LogicalResult FusedOp::verify() {
  namespace fz = mapp::rt::fused;
  fz::Program prog;
  std::string err = fz::parse(getProgram().str(), getInputs().size(), prog);
  if (!err.empty())
    return emitOpError("program: ") << err;
  if (getOutputs().size() != getValues().size())
    return emitOpError("has ") << getValues().size() << " results but "
                               << getOutputs().size() << " outputs";
  auto shape = [](Value v) {
    ArrayRef<int64_t> s = cast<RankedTensorType>(v.getType()).getShape();
    return std::vector<int64_t>(s.begin(), s.end());
  };
  std::vector<std::vector<int64_t>> ins, outs;
  for (Value v : getInputs())
    ins.push_back(shape(v));
  for (Value v : getValues())
    outs.push_back(shape(v));
  err = fz::checkShapes(prog, std::vector<int64_t>(getDomain().begin(), getDomain().end()), ins,
                        outs, std::vector<int64_t>(getOutputs().begin(), getOutputs().end()));
  if (!err.empty())
    return emitOpError("shapes: ") << err;
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

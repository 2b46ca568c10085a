#ifndef MAPP_OP_INTERFACES_TD
#define MAPP_OP_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Mapp_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mapp";
  let description = [{
    Work an op does, for partitioning, scheduling and simulation: floating
    point operations and bytes read and written (for communication ops, the
    bytes each rank sends).
  }];
  let methods = [
    InterfaceMethod<"Floating point operations of one execution.",
      "uint64_t", "getFlops", (ins), [{}], [{ return 0; }]>,
    InterfaceMethod<"Bytes read from memory.",
      "uint64_t", "getBytesRead", (ins), [{}],
      [{ return ::mapp::sumTensorBytes($_op->getOperands()); }]>,
    InterfaceMethod<"Bytes written to memory.",
      "uint64_t", "getBytesWritten", (ins), [{}],
      [{ return ::mapp::sumTensorBytes($_op->getResults()); }]>,
  ];
}

def Mapp_GradientOpInterface : OpInterface<"GradientOpInterface"> {
  let cppNamespace = "::mapp";
  let description = [{
    Reverse-mode rule used by `--mapp-autodiff`. Given the gradients of the
    op's results (null where a result has no gradient), build ops that compute
    the gradient of every differentiable operand and append them to
    `operandGrads` (null for operands without a gradient, e.g. token ids).
    Ops built for weight gradients are tagged `mapp.wgrad` so the backward
    can later be split into input-gradient and weight-gradient parts.
  }];
  let methods = [
    InterfaceMethod<"Build the operand gradients.",
      "::mlir::LogicalResult", "buildGradient",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // MAPP_OP_INTERFACES_TD

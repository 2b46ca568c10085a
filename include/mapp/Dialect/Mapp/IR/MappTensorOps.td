// The general tensor algebra (issue 38): elementwise arithmetic and math,
// comparisons, select, explicit broadcasting, constant tensors and casts.
// The exporter lowers any composition of aten ops onto these; the fused ops
// of MappOps.td (rms_norm, attention, cross_entropy, ...) are what pattern
// recognition rewrites recognized compositions into, never a requirement.
//
// Conventions (docs/semantics.md, "Tensor algebra"):
//  - Elementwise ops take operands of one type and give that type
//    (SameOperandsAndResultType): broadcasting is never implicit here; the
//    exporter inserts mapp.broadcast, whose verifier checks the rule.
//  - Booleans are 0/1 of the float type: comparisons give 1.0 where true,
//    0.0 where false; mapp.select picks where its condition is non-zero.
#ifndef MAPP_TENSOR_OPS_TD
#define MAPP_TENSOR_OPS_TD

include "mapp/Dialect/Mapp/IR/MappDialect.td"
include "mapp/Dialect/Mapp/IR/MappOpInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

// An elementwise op of the algebra: pure, one flop per element (per
// operand), differentiable.
class Mapp_AlgebraOp<string mnemonic, list<Trait> traits = []>
    : Mapp_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>,
        DeclareOpInterfaceMethods<Mapp_GradientOpInterface>])> {
  let extraClassDefinition = [{
    uint64_t $cppClass::getFlops() {
      auto t = ::llvm::cast<::mlir::ShapedType>(getOperation()->getResult(0).getType());
      return t.getNumElements() * std::max(1u, getOperation()->getNumOperands());
    }
  }];
}

class Mapp_MathOp<string mnemonic, string sum>
    : Mapp_AlgebraOp<mnemonic, [SameOperandsAndResultType]> {
  let summary = sum;
  let arguments = (ins Mapp_FloatTensor:$x);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

def Mapp_NegOp : Mapp_MathOp<"neg", "y = −x">;
def Mapp_AbsOp : Mapp_MathOp<"abs", "y = |x| (gradient sign(x)·dy, 0 at 0)">;
def Mapp_SignOp : Mapp_MathOp<"sign", "y = sign(x) ∈ {−1, 0, 1} (gradient 0)">;
def Mapp_ExpOp : Mapp_MathOp<"exp", "y = eˣ">;
def Mapp_LogOp : Mapp_MathOp<"log", "natural logarithm">;
def Mapp_SqrtOp : Mapp_MathOp<"sqrt", "square root">;
def Mapp_RsqrtOp : Mapp_MathOp<"rsqrt", "y = 1/√x"> {
  let description = [{
    Canonicalization rewrites an RMS norm written with the algebra,
    x·broadcast(rsqrt(reduce_sum(x²)/H + eps))·w (x² as pow 2 or x·x, the
    sum over the last dim kept as 1, w of shape [H]), into mapp.rms_norm
    (the fused op pattern recognition would have made at export).
  }];
  let hasCanonicalizer = 1;
}
def Mapp_TanhOp : Mapp_MathOp<"tanh", "hyperbolic tangent">;
def Mapp_SinOp : Mapp_MathOp<"sin", "sine">;
def Mapp_CosOp : Mapp_MathOp<"cos", "cosine">;
def Mapp_SigmoidOp : Mapp_MathOp<"sigmoid", "y = 1/(1 + e⁻ˣ)">;

def Mapp_PowOp : Mapp_AlgebraOp<"pow", [SameOperandsAndResultType]> {
  let summary = "y = xᵉ for a constant exponent e (torch.pow(x, float))";
  let arguments = (ins Mapp_FloatTensor:$x, F64Attr:$exponent);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` type($x)";
}

class Mapp_ElementwiseBinaryOp<string mnemonic, string sum>
    : Mapp_AlgebraOp<mnemonic, [SameOperandsAndResultType]> {
  let summary = sum;
  let description = [{
    Operands and result of one type: broadcast an operand first with
    mapp.broadcast.
  }];
  let arguments = (ins Mapp_FloatTensor:$lhs, Mapp_FloatTensor:$rhs);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Mapp_SubOp : Mapp_ElementwiseBinaryOp<"sub", "elementwise difference lhs − rhs">;
def Mapp_DivOp : Mapp_ElementwiseBinaryOp<"div", "elementwise quotient lhs / rhs">;
def Mapp_MaximumOp : Mapp_ElementwiseBinaryOp<"maximum",
    "elementwise max (torch.maximum: a tie splits the gradient in halves)">;
def Mapp_MinimumOp : Mapp_ElementwiseBinaryOp<"minimum",
    "elementwise min (torch.minimum: a tie splits the gradient in halves)">;

// Comparisons: 1.0 where the relation holds, else 0.0; no gradient flows
// through them (they are piecewise constant).
def Mapp_LtOp : Mapp_ElementwiseBinaryOp<"lt", "1 where lhs < rhs, else 0">;
def Mapp_LeOp : Mapp_ElementwiseBinaryOp<"le", "1 where lhs ≤ rhs, else 0">;
def Mapp_GtOp : Mapp_ElementwiseBinaryOp<"gt", "1 where lhs > rhs, else 0">;
def Mapp_GeOp : Mapp_ElementwiseBinaryOp<"ge", "1 where lhs ≥ rhs, else 0">;
def Mapp_EqOp : Mapp_ElementwiseBinaryOp<"eq", "1 where lhs = rhs, else 0">;
def Mapp_NeOp : Mapp_ElementwiseBinaryOp<"ne", "1 where lhs ≠ rhs, else 0">;

def Mapp_SelectOp : Mapp_AlgebraOp<"select", [SameOperandsAndResultType]> {
  let summary = "torch.where: on_true where cond ≠ 0, else on_false";
  let description = [{
    `cond` is a 0/1 mask of the operands' type (a comparison, or a constant
    mask); the gradient goes to the chosen side only (none to `cond`).
  }];
  let arguments = (ins Mapp_FloatTensor:$cond, Mapp_FloatTensor:$on_true,
                       Mapp_FloatTensor:$on_false);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$cond `,` $on_true `,` $on_false attr-dict `:` type($result)";
}

def Mapp_BroadcastOp : Mapp_AlgebraOp<"broadcast"> {
  let summary = "x.expand(result shape), NumPy's rule";
  let description = [{
    The explicit form of broadcasting: `x`'s dims align with the result's
    trailing dims; each is equal to the result's or 1 (repeated), and the
    result may have more leading dims (repeated). Same element type. The
    gradient sums over the repeated dims (mapp.reduce_sum, mapp.reshape).
  }];
  let arguments = (ins Mapp_FloatTensor:$x);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Mapp_ConstantOp : Mapp_Op<"constant", [Pure, ConstantLike,
    DeclareOpInterfaceMethods<Mapp_CostOpInterface, ["getFlops"]>]> {
  let summary = "a constant tensor (a non-trainable buffer: rotary table, mask)";
  let description = [{
    The elements are stored in the plan (the instruction's `value` attribute
    as a list of floats) and written to the result each time the op runs.
    A table computed for the longest sequence is sliced to the current
    length by mapp.slice like any tensor. Not a parameter: no gradient, no
    optimizer update, not in checkpoints.
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let extraClassDefinition = [{
    uint64_t $cppClass::getFlops() { return 0; }
  }];
}

def Mapp_CastOp : Mapp_AlgebraOp<"cast"> {
  let summary = "element type conversion (x.to(dtype)), same shape";
  let description = [{
    Float to float (f32, bf16, f16: rounded to nearest even) or integer
    (i32, i64) to float. The gradient of a float cast is the cast back;
    none flows into an integer operand.
  }];
  let arguments = (ins AnyTypeOf<[Mapp_FloatTensor, Mapp_IndexTensor]>:$x);
  let results = (outs Mapp_FloatTensor:$result);
  let assemblyFormat = "$x attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

#endif // MAPP_TENSOR_OPS_TD

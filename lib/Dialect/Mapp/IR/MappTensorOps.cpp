// The tensor algebra of MappTensorOps.td: verifiers, folders and gradient
// rules. Every gradient is written with ops of the algebra itself, so the
// runtime needs no *_grad kernel for them.
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/PatternMatch.h"

#include <cmath>

using namespace mlir;
using namespace mapp;

namespace {

RankedTensorType typeOf(Value v) { return cast<RankedTensorType>(v.getType()); }

Value fillLike(OpBuilder &b, Location loc, Value like, double v) {
  return b.create<FillOp>(loc, like.getType(), b.getF64FloatAttr(v));
}
Value mul(OpBuilder &b, Location loc, Value x, Value y) {
  return b.create<MulOp>(loc, x.getType(), x, y);
}
Value scaled(OpBuilder &b, Location loc, Value x, double f) {
  return b.create<ScaleOp>(loc, x.getType(), x, b.getF64FloatAttr(f));
}

/// The dims of `result` that mapp.broadcast repeats `x` along: the leading
/// dims `x` lacks and the dims where `x` has 1 and the result does not.
SmallVector<int64_t> broadcastDims(ArrayRef<int64_t> x, ArrayRef<int64_t> result) {
  SmallVector<int64_t> dims;
  size_t lead = result.size() - x.size();
  for (size_t i = 0; i < result.size(); ++i)
    if (i < lead || (x[i - lead] == 1 && result[i] != 1))
      dims.push_back(i);
  return dims;
}

/// dy summed down to `target`'s shape over the dims a broadcast repeated.
Value sumToShape(OpBuilder &b, Location loc, Value dy, Value target) {
  RankedTensorType t = typeOf(target), g = typeOf(dy);
  if (t.getShape() == g.getShape())
    return dy;
  SmallVector<int64_t> dims = broadcastDims(t.getShape(), g.getShape());
  SmallVector<int64_t> kept;
  for (auto [i, d] : llvm::enumerate(g.getShape()))
    if (!llvm::is_contained(dims, static_cast<int64_t>(i)))
      kept.push_back(d);
  Value sum = b.create<ReduceSumOp>(
      loc, RankedTensorType::get(kept, g.getElementType()), dy,
      b.getDenseI64ArrayAttr(dims));
  if (typeOf(sum).getShape() == t.getShape())
    return sum;
  return b.create<ReshapeOp>(loc, RankedTensorType::get(t.getShape(), g.getElementType()), sum);
}

} // namespace

//===----------------------------------------------------------------------===//
// Verifiers and folders
//===----------------------------------------------------------------------===//

LogicalResult BroadcastOp::verify() {
  RankedTensorType x = typeOf(getX()), r = typeOf(getResult());
  if (x.getElementType() != r.getElementType())
    return emitOpError("result element type ")
           << r.getElementType() << " differs from the operand's "
           << x.getElementType();
  if (x.getRank() > r.getRank())
    return emitOpError("operand of rank ")
           << x.getRank() << " cannot broadcast to rank " << r.getRank();
  size_t lead = r.getRank() - x.getRank();
  for (int64_t i = 0; i < x.getRank(); ++i) {
    int64_t xd = x.getShape()[i], rd = r.getShape()[lead + i];
    if (xd != rd && xd != 1)
      return emitOpError("operand dim ")
             << i << " of size " << xd << " is neither 1 nor the result's "
             << rd << " (NumPy broadcasting aligns trailing dims)";
  }
  return success();
}

OpFoldResult BroadcastOp::fold(FoldAdaptor) {
  return getX().getType() == getType() ? getX() : OpFoldResult();
}

LogicalResult ConstantOp::verify() {
  auto vt = dyn_cast<ShapedType>(getValue().getType());
  RankedTensorType r = typeOf(getResult());
  if (!vt || vt.getShape() != r.getShape() ||
      vt.getElementType() != r.getElementType())
    return emitOpError("value of type ")
           << getValue().getType() << " does not match the result type " << r;
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

LogicalResult CastOp::verify() {
  if (typeOf(getX()).getShape() != typeOf(getResult()).getShape())
    return emitOpError("changes the shape ")
           << typeOf(getX()) << " -> " << typeOf(getResult())
           << " (a cast converts elements only)";
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  return getX().getType() == getType() ? getX() : OpFoldResult();
}

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

#define MAPP_GRADIENT(Op)                                                      \
  LogicalResult Op::buildGradient(OpBuilder &b, ArrayRef<Value> dys,           \
                                  SmallVectorImpl<Value> &grads)

MAPP_GRADIENT(NegOp) {
  grads.push_back(b.create<NegOp>(getLoc(), dys[0]));
  return success();
}

MAPP_GRADIENT(AbsOp) {
  Location loc = getLoc();
  grads.push_back(mul(b, loc, dys[0], b.create<SignOp>(loc, getX())));
  return success();
}

MAPP_GRADIENT(SignOp) {
  grads.push_back(Value()); // zero almost everywhere
  return success();
}

MAPP_GRADIENT(ExpOp) {
  grads.push_back(mul(b, getLoc(), dys[0], getResult()));
  return success();
}

MAPP_GRADIENT(LogOp) {
  grads.push_back(b.create<DivOp>(getLoc(), dys[0], getX()));
  return success();
}

MAPP_GRADIENT(SqrtOp) { // dy / (2·y)
  Location loc = getLoc();
  grads.push_back(scaled(b, loc, b.create<DivOp>(loc, dys[0], getResult()), 0.5));
  return success();
}

MAPP_GRADIENT(RsqrtOp) { // −½·dy·y³
  Location loc = getLoc();
  Value y = getResult();
  grads.push_back(scaled(b, loc, mul(b, loc, mul(b, loc, dys[0], y), mul(b, loc, y, y)), -0.5));
  return success();
}

MAPP_GRADIENT(TanhOp) { // dy − dy·y·y
  Location loc = getLoc();
  Value y = getResult();
  grads.push_back(b.create<SubOp>(loc, dys[0], mul(b, loc, mul(b, loc, dys[0], y), y)));
  return success();
}

MAPP_GRADIENT(SinOp) {
  Location loc = getLoc();
  grads.push_back(mul(b, loc, dys[0], b.create<CosOp>(loc, getX())));
  return success();
}

MAPP_GRADIENT(CosOp) {
  Location loc = getLoc();
  grads.push_back(b.create<NegOp>(loc, mul(b, loc, dys[0], b.create<SinOp>(loc, getX()))));
  return success();
}

MAPP_GRADIENT(SigmoidOp) { // dy·y − dy·y·y
  Location loc = getLoc();
  Value dyy = mul(b, loc, dys[0], getResult());
  grads.push_back(b.create<SubOp>(loc, dyy, mul(b, loc, dyy, getResult())));
  return success();
}

MAPP_GRADIENT(PowOp) { // e·xᵉ⁻¹·dy
  Location loc = getLoc();
  double e = getExponent().convertToDouble();
  if (e == 0) {
    grads.push_back(Value());
  } else if (e == 1) {
    grads.push_back(dys[0]);
  } else {
    Value p = e == 2 ? getX()
                     : b.create<PowOp>(loc, getX(), b.getF64FloatAttr(e - 1)).getResult();
    grads.push_back(scaled(b, loc, mul(b, loc, dys[0], p), e));
  }
  return success();
}

MAPP_GRADIENT(SubOp) {
  grads.push_back(dys[0]);
  grads.push_back(b.create<NegOp>(getLoc(), dys[0]));
  return success();
}

MAPP_GRADIENT(DivOp) { // dy/b, −(dy·y)/b
  Location loc = getLoc();
  grads.push_back(b.create<DivOp>(loc, dys[0], getRhs()));
  grads.push_back(b.create<NegOp>(
      loc, b.create<DivOp>(loc, mul(b, loc, dys[0], getResult()), getRhs())));
  return success();
}

/// torch.maximum / minimum: the gradient goes to the chosen operand, halves
/// on a tie. `wins` is 1 where lhs is chosen strictly (gt for max).
template <typename WinsOp, typename LosesOp>
static void extremumGradient(OpBuilder &b, Location loc, Value dy, Value lhs,
                             Value rhs, SmallVectorImpl<Value> &grads) {
  Value tie = scaled(b, loc, b.create<EqOp>(loc, lhs, rhs), 0.5);
  Value wl = b.create<AddOp>(loc, lhs.getType(), b.create<WinsOp>(loc, lhs, rhs), tie);
  Value wr = b.create<AddOp>(loc, lhs.getType(), b.create<LosesOp>(loc, lhs, rhs), tie);
  grads.push_back(mul(b, loc, dy, wl));
  grads.push_back(mul(b, loc, dy, wr));
}

MAPP_GRADIENT(MaximumOp) {
  extremumGradient<GtOp, LtOp>(b, getLoc(), dys[0], getLhs(), getRhs(), grads);
  return success();
}

MAPP_GRADIENT(MinimumOp) {
  extremumGradient<LtOp, GtOp>(b, getLoc(), dys[0], getLhs(), getRhs(), grads);
  return success();
}

#define MAPP_NO_GRADIENT(Op)                                                   \
  MAPP_GRADIENT(Op) {                                                          \
    grads.append(2, Value());                                                  \
    return success();                                                          \
  }
MAPP_NO_GRADIENT(LtOp)
MAPP_NO_GRADIENT(LeOp)
MAPP_NO_GRADIENT(GtOp)
MAPP_NO_GRADIENT(GeOp)
MAPP_NO_GRADIENT(EqOp)
MAPP_NO_GRADIENT(NeOp)
#undef MAPP_NO_GRADIENT

MAPP_GRADIENT(SelectOp) {
  Location loc = getLoc();
  Value zero = fillLike(b, loc, dys[0], 0.0);
  grads.push_back(Value());
  grads.push_back(b.create<SelectOp>(loc, getCond(), dys[0], zero));
  grads.push_back(b.create<SelectOp>(loc, getCond(), zero, dys[0]));
  return success();
}

MAPP_GRADIENT(BroadcastOp) {
  grads.push_back(sumToShape(b, getLoc(), dys[0], getX()));
  return success();
}

MAPP_GRADIENT(CastOp) {
  if (isa<FloatType>(typeOf(getX()).getElementType()))
    grads.push_back(b.create<CastOp>(getLoc(), getX().getType(), dys[0]));
  else
    grads.push_back(Value());
  return success();
}

/// A reduction's result (or its gradient) repeated back to the operand
/// `x`'s shape: reshaped with the reduced dims kept as 1, then broadcast.
static Value repeatOverReduced(OpBuilder &b, Location loc, Value v, Value x,
                               ArrayRef<int64_t> dims) {
  RankedTensorType xt = typeOf(x);
  SmallVector<int64_t> keep(xt.getShape());
  for (int64_t d : dims)
    keep[d] = 1;
  if (typeOf(v).getShape() != ArrayRef<int64_t>(keep))
    v = b.create<ReshapeOp>(
        loc, RankedTensorType::get(keep, typeOf(v).getElementType()), v);
  return b.create<BroadcastOp>(loc, xt, v);
}

// reduce_sum and reduce_max are ops of MappOps.td; their rules live with
// the broadcast they need.
MAPP_GRADIENT(ReduceSumOp) {
  grads.push_back(repeatOverReduced(b, getLoc(), dys[0], getX(), getDims()));
  return success();
}

MAPP_GRADIENT(ReduceMaxOp) { // torch.amax: dy shared among a slice's maxima
  Location loc = getLoc();
  Value hit = b.create<EqOp>(
      loc, getX(), repeatOverReduced(b, loc, getResult(), getX(), getDims()));
  Value count = b.create<ReduceSumOp>(loc, getResult().getType(), hit,
                                      b.getDenseI64ArrayAttr(getDims()));
  Value share = b.create<DivOp>(loc, dys[0], count);
  grads.push_back(
      mul(b, loc, repeatOverReduced(b, loc, share, getX(), getDims()), hit));
  return success();
}
#undef MAPP_GRADIENT

//===----------------------------------------------------------------------===//
// Canonicalization: recognition as a rewrite
//===----------------------------------------------------------------------===//

namespace {

/// x·x or pow(x, 2): returns x.
Value squaredOperand(Value v) {
  if (auto p = v.getDefiningOp<PowOp>())
    return p.getExponent().convertToDouble() == 2.0 ? p.getX() : Value();
  if (auto m = v.getDefiningOp<MulOp>())
    return m.getLhs() == m.getRhs() ? m.getLhs() : Value();
  return Value();
}

/// mul(mul(x, broadcast(rsqrt(add(scale(reshape(reduce_sum(x²)), 1/H),
/// fill eps)))), w[H]) -> rms_norm(x, w) {eps}. Either operand order of
/// both muls; the normalized value must have no other reader (else the
/// generic ops stay and the work is done twice).
struct FuseRMSNorm : OpRewritePattern<MulOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(MulOp op, PatternRewriter &rw) const override {
    for (auto [normalized, weight] :
         {std::pair(op.getLhs(), op.getRhs()), std::pair(op.getRhs(), op.getLhs())}) {
      std::optional<std::pair<Value, double>> xe = normalizedInput(normalized);
      if (!xe || !normalized.hasOneUse())
        continue;
      auto x = typeOf(xe->first), w = typeOf(weight);
      if (w.getRank() != 1 || w.getDimSize(0) != x.getShape().back() ||
          w.getElementType() != x.getElementType() || op.getType() != x)
        continue;
      rw.replaceOpWithNewOp<RMSNormOp>(op, x, xe->first, weight,
                                       rw.getF64FloatAttr(xe->second),
                                       rw.getF64FloatAttr(0.0));
      return success();
    }
    return failure();
  }

  /// (x, eps) when v = x·broadcast(rsqrt(mean(x²) + eps)).
  static std::optional<std::pair<Value, double>> normalizedInput(Value v) {
    auto mul = v.getDefiningOp<MulOp>();
    if (!mul)
      return std::nullopt;
    for (auto [x, b] : {std::pair(mul.getLhs(), mul.getRhs()),
                        std::pair(mul.getRhs(), mul.getLhs())}) {
      auto bc = b.getDefiningOp<BroadcastOp>();
      auto rs = bc ? bc.getX().getDefiningOp<RsqrtOp>() : RsqrtOp();
      auto add = rs ? rs.getX().getDefiningOp<AddOp>() : AddOp();
      if (!add)
        continue;
      auto fill = add.getRhs().getDefiningOp<FillOp>();
      auto scale = add.getLhs().getDefiningOp<ScaleOp>();
      auto keep = scale ? scale.getX().getDefiningOp<ReshapeOp>() : ReshapeOp();
      auto sum = keep ? keep.getX().getDefiningOp<ReduceSumOp>() : ReduceSumOp();
      if (!fill || !sum || squaredOperand(sum.getX()) != x)
        continue;
      RankedTensorType xt = typeOf(x);
      int64_t h = xt.getShape().back();
      ArrayRef<int64_t> dims = sum.getDims();
      if (dims.size() != 1 || dims[0] != xt.getRank() - 1 ||
          typeOf(keep.getResult()).getShape().back() != 1 ||
          std::fabs(scale.getFactor().convertToDouble() * h - 1.0) > 1e-12 ||
          typeOf(mul.getResult()) != xt)
        continue;
      return std::pair(x, fill.getValue().convertToDouble());
    }
    return std::nullopt;
  }
};

} // namespace

void RsqrtOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                          MLIRContext *context) {
  results.add<FuseRMSNorm>(context);
}

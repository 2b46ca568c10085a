// Reverse-mode rules of the gradient interface, one per differentiable op.
// Ops that produce parameter (weight) gradients are tagged `mapp.wgrad` so a
// later pass can split the backward into input-gradient and weight-gradient
// parts (zero-bubble schedules).
#include "mapp/Dialect/Mapp/IR/MappOps.h"

using namespace mlir;
using namespace mapp;

static constexpr llvm::StringLiteral kWGrad = "mapp.wgrad";

static RankedTensorType tensorType(Value v) {
  return cast<RankedTensorType>(v.getType());
}
static RankedTensorType withShape(Value like, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, tensorType(like).getElementType());
}
template <typename OpT>
static OpT tagWGrad(OpT op) {
  op->setAttr(kWGrad, UnitAttr::get(op->getContext()));
  return op;
}

/// Flattens [d0, ..., dn-2, dn-1] to [d0·…·dn-2, dn-1].
static Value flattenRows(OpBuilder &b, Location loc, Value v) {
  ArrayRef<int64_t> s = tensorType(v).getShape();
  if (s.size() == 2)
    return v;
  int64_t rows = 1;
  for (int64_t d : s.drop_back())
    rows *= d;
  return b.create<ReshapeOp>(loc, withShape(v, {rows, s.back()}), v);
}

/// Sums `grad` (shaped like lhs) down to `target`'s shape, a suffix of it.
static Value reduceToSuffix(OpBuilder &b, Location loc, Value grad,
                            Value target) {
  ArrayRef<int64_t> g = tensorType(grad).getShape();
  size_t lead = g.size() - tensorType(target).getRank();
  if (lead == 0)
    return grad;
  SmallVector<int64_t> dims;
  for (size_t i = 0; i < lead; ++i)
    dims.push_back(i);
  return b.create<ReduceSumOp>(loc, target.getType(), grad,
                               b.getDenseI64ArrayAttr(dims));
}

LogicalResult EmbeddingOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  int64_t vocab = tensorType(getTable()).getShape()[0];
  grads.push_back(tagWGrad(b.create<EmbeddingGradOp>(
      getLoc(), getTable().getType(), dys[0], getIds(),
      b.getI64IntegerAttr(vocab), getGroupAttr())));
  grads.push_back(Value());
  return success();
}

LogicalResult LinearOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                      SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  Value dy = dys[0];
  if (tensorType(getX()).getRank() < 2)
    return emitOpError("gradient needs x of rank >= 2");
  // dx = dy·w
  grads.push_back(b.create<MatmulOp>(loc, getX().getType(), dy, getW(),
                                     /*transpose_a=*/false,
                                     /*transpose_b=*/false));
  // dw = dyᵀ·x over all rows
  grads.push_back(tagWGrad(b.create<MatmulOp>(
      loc, getW().getType(), flattenRows(b, loc, dy),
      flattenRows(b, loc, getX()), /*transpose_a=*/true,
      /*transpose_b=*/false)));
  if (getBias())
    grads.push_back(tagWGrad(reduceToSuffix(b, loc, dy, getBias())
                                 .getDefiningOp<ReduceSumOp>()));
  return success();
}

LogicalResult MatmulOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                      SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  Value dc = dys[0], a = getA(), bm = getB();
  bool ta = getTransposeA(), tb = getTransposeB();
  bool sameRank = tensorType(a).getRank() == tensorType(bm).getRank();
  if (!sameRank && ta)
    return emitOpError("gradient of a transposed batched `a` against a 2-d `b` "
                       "is not supported; reshape `a` to 2-d first");
  // da = dc·op(b)ᵀ, or op(b)·dcᵀ when a was transposed.
  if (!ta)
    grads.push_back(b.create<MatmulOp>(loc, a.getType(), dc, bm, false, !tb));
  else
    grads.push_back(b.create<MatmulOp>(loc, a.getType(), bm, dc, tb, true));
  // db = op(a)ᵀ·dc (or its transpose), summing over a's batch when b is 2-d.
  Value aRows = sameRank ? a : flattenRows(b, loc, a);
  Value dcRows = sameRank ? dc : flattenRows(b, loc, dc);
  if (!tb)
    grads.push_back(b.create<MatmulOp>(loc, bm.getType(), aRows, dcRows, !ta,
                                       false));
  else
    grads.push_back(b.create<MatmulOp>(loc, bm.getType(), dcRows, aRows, true,
                                       ta));
  return success();
}

LogicalResult AddOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                   SmallVectorImpl<Value> &grads) {
  grads.push_back(dys[0]);
  grads.push_back(reduceToSuffix(b, getLoc(), dys[0], getRhs()));
  return success();
}

LogicalResult MulOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                   SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  grads.push_back(b.create<MulOp>(loc, getLhs().getType(), dys[0], getRhs()));
  Value full = b.create<MulOp>(loc, getLhs().getType(), dys[0], getLhs());
  grads.push_back(reduceToSuffix(b, loc, full, getRhs()));
  return success();
}

LogicalResult ScaleOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                     SmallVectorImpl<Value> &grads) {
  grads.push_back(
      b.create<ScaleOp>(getLoc(), getType(), dys[0], getFactorAttr()));
  return success();
}

LogicalResult GeluOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                    SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<GeluGradOp>(getLoc(), getType(), dys[0], getX(),
                                       getApproximateAttr()));
  return success();
}

LogicalResult SiluOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                    SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<SiluGradOp>(getLoc(), getType(), dys[0], getX()));
  return success();
}

LogicalResult SoftcapOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(
      b.create<SoftcapGradOp>(getLoc(), getType(), dys[0], getX(), getCapAttr()));
  return success();
}

LogicalResult LayerNormOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  auto g = b.create<LayerNormGradOp>(
      getLoc(),
      TypeRange{getX().getType(), getGamma().getType(), getBeta().getType()},
      dys[0], getX(), getGamma(), getEpsAttr());
  grads.append({g.getDx(), g.getDgamma(), g.getDbeta()});
  return success();
}

LogicalResult RMSNormOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  auto g = b.create<RMSNormGradOp>(
      getLoc(), TypeRange{getX().getType(), getGamma().getType()}, dys[0],
      getX(), getGamma(), getEpsAttr(), getWeightOffsetAttr());
  grads.append({g.getDx(), g.getDgamma()});
  return success();
}

LogicalResult SoftmaxOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(
      b.create<SoftmaxGradOp>(getLoc(), getType(), dys[0], getResult()));
  return success();
}

LogicalResult AttentionOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  Type t = getQ().getType(), kv = getK().getType();
  auto g = b.create<AttentionGradOp>(
      getLoc(), TypeRange{t, kv, kv}, dys[0], getQ(), getK(), getV(),
      getHeadsAttr(), getScaleAttr(), getCausalAttr(), getRotaryAttr(),
      getRotaryBaseAttr(), getRotaryDimAttr(), getSoftcapAttr(),
      getSlidingWindowAttr(), getDropoutAttr(), getDropoutSeedAttr());
  grads.append({g.getDq(), g.getDk(), g.getDv()});
  return success();
}

LogicalResult DropoutOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<DropoutGradOp>(getLoc(), getType(), dys[0],
                                          getPAttr(), getSeedAttr()));
  return success();
}

LogicalResult CrossEntropyOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                            SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<CrossEntropyGradOp>(
      getLoc(), getLogits().getType(), dys[0], getLogits(), getTargets(),
      getIgnoreIndexAttr()));
  grads.push_back(Value());
  return success();
}

LogicalResult ReshapeOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                       SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<ReshapeOp>(getLoc(), getX().getType(), dys[0]));
  return success();
}

LogicalResult TransposeOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  ArrayRef<int64_t> perm = getPerm();
  SmallVector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inverse[perm[i]] = i;
  grads.push_back(b.create<TransposeOp>(getLoc(), getX().getType(), dys[0],
                                        b.getDenseI64ArrayAttr(inverse)));
  return success();
}

LogicalResult SliceOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                     SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<SliceGradOp>(getLoc(), getX().getType(), dys[0],
                                        getDimAttr(), getStartAttr()));
  return success();
}

LogicalResult ConcatOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                      SmallVectorImpl<Value> &grads) {
  int64_t dim = getDimAttr().getInt(), offset = 0;
  for (Value in : getInputs()) {
    int64_t len = tensorType(in).getShape()[dim];
    grads.push_back(b.create<SliceOp>(getLoc(), in.getType(), dys[0],
                                      getDimAttr(),
                                      b.getI64IntegerAttr(offset),
                                      b.getI64IntegerAttr(offset + len)));
    offset += len;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Tensor parallelism (Megatron's conjugate operators, docs/semantics.md).
// Convention: a value computed identically on every member of a group
// ("replicated") has the same gradient on every member; a tp-sharded region
// produces partial input gradients that must be summed over the group.
//===----------------------------------------------------------------------===//

LogicalResult CopyToGroupOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                           SmallVectorImpl<Value> &grads) {
  // f: the shards' partial gradients of a replicated input are summed.
  grads.push_back(b.create<AllReduceOp>(getLoc(), getType(), dys[0],
                                        getGroupAttr(), DenseI64ArrayAttr(),
                                        b.getStringAttr("sum")));
  return success();
}

LogicalResult AllReduceOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  // g: the sum is replicated, so every member's summand gets the (same)
  // gradient of the sum. Only meaningful where the consumers are
  // replicated over the group, which holds for tensor parallelism.
  if (getReduction() != "sum" || getGroupName() != "tp")
    return emitOpError("gradient is defined only for reduction = \"sum\" "
                       "over group \"tp\"");
  grads.push_back(dys[0]);
  return success();
}

LogicalResult AllGatherOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  // Sequence parallel: the gathered value feeds tp-sharded consumers whose
  // gradients are partial sums; each member keeps the sum of its slice.
  if (getGroupName() != "tp")
    return emitOpError("gradient is defined only over group \"tp\"");
  grads.push_back(b.create<ReduceScatterOp>(getLoc(), getX().getType(), dys[0],
                                            getGroupAttr(), getRanksAttr(),
                                            getDimAttr()));
  return success();
}

LogicalResult ReduceScatterOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                             SmallVectorImpl<Value> &grads) {
  if (getGroupName() != "tp")
    return emitOpError("gradient is defined only over group \"tp\"");
  grads.push_back(b.create<AllGatherOp>(getLoc(), getX().getType(), dys[0],
                                        getGroupAttr(), getRanksAttr(),
                                        getDimAttr()));
  return success();
}

LogicalResult ScatterToGroupOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                              SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<AllGatherOp>(getLoc(), getX().getType(), dys[0],
                                        getGroupAttr(), DenseI64ArrayAttr(),
                                        getDimAttr()));
  return success();
}

LogicalResult VocabCEPartialsOp::buildGradient(OpBuilder &b,
                                               ArrayRef<Value> dys,
                                               SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<VocabCEPartialsGradOp>(
      getLoc(), getLogits().getType(), dys[0], getLogits(), getTargets(),
      getRowmax(), getGroupAttr()));
  // No gradient for the targets, and none for rowmax: the loss is invariant
  // to the shift, so its derivative through rowmax is exactly zero.
  grads.push_back(Value());
  grads.push_back(Value());
  return success();
}

LogicalResult CEFromPartialsOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                              SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<CEFromPartialsGradOp>(
      getLoc(), getPartials().getType(), dys[0], getPartials(), getTargets(),
      getIgnoreIndexAttr()));
  grads.push_back(Value());
  return success();
}

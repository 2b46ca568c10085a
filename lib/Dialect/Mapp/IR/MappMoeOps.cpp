//===- MappMoeOps.cpp - verifiers, costs and gradients of the MoE ops -----===//
//
// The shape rules here are the compile-time half of the runtime loader's
// checks (KernelSpecs.cpp, moe_* entries); data-dependent conditions (expert
// ids and slots in range, Σ counts <= rows) are the kernels' to check.
//
//===----------------------------------------------------------------------===//
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mapp;

static constexpr llvm::StringLiteral kWGrad = "mapp.wgrad";

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}
static uint64_t numel(Value v) {
  auto t = cast<RankedTensorType>(v.getType());
  return t.hasStaticShape() ? (uint64_t)t.getNumElements() : 0;
}
static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  llvm::interleave(
      shape, [&](int64_t d) { s += std::to_string(d); }, [&] { s += ","; });
  return s + "]";
}

static LogicalResult wantRank(Operation *op, Value v, int64_t rank,
                              StringRef what) {
  if ((int64_t)shapeOf(v).size() != rank)
    return op->emitOpError() << what << " must have rank " << rank << ", got "
                             << shapeStr(shapeOf(v));
  return success();
}
static LogicalResult wantShape(Operation *op, Value v, ArrayRef<int64_t> s,
                               StringRef what) {
  if (shapeOf(v) != s)
    return op->emitOpError() << what << " must be " << shapeStr(s) << ", got "
                             << shapeStr(shapeOf(v));
  return success();
}
/// `probs`-like [N, k] and `slots`/`experts`-like [N, k] agree.
static LogicalResult wantChoices(Operation *op, Value a, StringRef wa, Value b,
                                 StringRef wb) {
  if (failed(wantRank(op, a, 2, wa)))
    return failure();
  return wantShape(op, b, shapeOf(a), wb);
}

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

LogicalResult MoeRouterOp::verify() {
  if (failed(wantRank(*this, getLogits(), 2, "logits")))
    return failure();
  int64_t n = shapeOf(getLogits())[0], e = shapeOf(getLogits())[1];
  int64_t k = getTopk();
  if (k <= 0)
    return emitOpError("topk must be >= 1, got ") << k;
  if (k > e)
    return emitOpError("topk ") << k << " exceeds the expert count " << e;
  if (failed(wantShape(*this, getProbs(), {n, k}, "probs")) ||
      failed(wantShape(*this, getExperts(), {n, k}, "experts")))
    return failure();
  return success();
}

LogicalResult MoeRouterGradOp::verify() {
  if (failed(wantChoices(*this, getProbs(), "probs", getDprobs(), "dprobs")) ||
      failed(wantShape(*this, getExperts(), shapeOf(getProbs()), "experts")) ||
      failed(wantRank(*this, getResult(), 2, "dlogits")))
    return failure();
  if (shapeOf(getResult())[0] != shapeOf(getProbs())[0] ||
      shapeOf(getResult())[1] < shapeOf(getProbs())[1])
    return emitOpError("dlogits must be [N, E >= k] for probs ")
           << shapeStr(shapeOf(getProbs())) << ", got "
           << shapeStr(shapeOf(getResult()));
  return success();
}

LogicalResult MoeAssignOp::verify() {
  if (failed(wantChoices(*this, getProbs(), "probs", getExperts(), "experts")) ||
      failed(wantShape(*this, getSlots(), shapeOf(getProbs()), "slots")))
    return failure();
  int64_t e = getNumExperts();
  if (e <= 0)
    return emitOpError("num_experts must be >= 1, got ") << e;
  if (shapeOf(getProbs())[1] > e)
    return emitOpError("top-k ") << shapeOf(getProbs())[1]
                                 << " exceeds num_experts " << e;
  if (failed(wantShape(*this, getCounts(), {e}, "counts")))
    return failure();
  if (auto c = getCapacityAttr(); c && c.getInt() <= 0)
    return emitOpError("capacity must be >= 1 token per expert, got ")
           << c.getInt();
  return success();
}

/// x [N, H] / dx, slots [N, k], permuted [R, H].
static LogicalResult verifyPermute(Operation *op, Value tokens, Value slots,
                                   Value permuted) {
  if (failed(wantRank(op, tokens, 2, "token rows")) ||
      failed(wantRank(op, slots, 2, "slots")) ||
      failed(wantRank(op, permuted, 2, "permuted rows")))
    return failure();
  if (shapeOf(slots)[0] != shapeOf(tokens)[0])
    return op->emitOpError("slots ")
           << shapeStr(shapeOf(slots)) << " must have one row per token of "
           << shapeStr(shapeOf(tokens));
  if (shapeOf(permuted)[1] != shapeOf(tokens)[1])
    return op->emitOpError("permuted rows ")
           << shapeStr(shapeOf(permuted)) << " and token rows "
           << shapeStr(shapeOf(tokens)) << " must have the same width";
  return success();
}

LogicalResult MoePermuteOp::verify() {
  return verifyPermute(*this, getX(), getSlots(), getResult());
}
LogicalResult MoePermuteGradOp::verify() {
  return verifyPermute(*this, getResult(), getSlots(), getDy());
}
LogicalResult MoeUnpermuteOp::verify() {
  if (failed(verifyPermute(*this, getResult(), getSlots(), getY())))
    return failure();
  return wantShape(*this, getProbs(), shapeOf(getSlots()), "probs");
}
LogicalResult MoeUnpermuteGradOp::verify() {
  if (failed(verifyPermute(*this, getDout(), getSlots(), getY())) ||
      failed(wantShape(*this, getProbs(), shapeOf(getSlots()), "probs")) ||
      failed(wantShape(*this, getDy(), shapeOf(getY()), "dy")) ||
      failed(wantShape(*this, getDprobs(), shapeOf(getSlots()), "dprobs")))
    return failure();
  return success();
}

LogicalResult MoeGroupedMatmulOp::verify() {
  if (failed(wantRank(*this, getX(), 2, "x")) ||
      failed(wantRank(*this, getW(), 3, "w")) ||
      failed(wantRank(*this, getCounts(), 1, "counts")))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), w = shapeOf(getW());
  if (shapeOf(getCounts())[0] != w[0])
    return emitOpError("counts ") << shapeStr(shapeOf(getCounts()))
                                  << " must have one entry per expert of w "
                                  << shapeStr(w);
  int64_t k = getTransposeB() ? w[2] : w[1], n = getTransposeB() ? w[1] : w[2];
  if (k != x[1])
    return emitOpError("w ") << shapeStr(w) << " does not take rows of x "
                             << shapeStr(x)
                             << (getTransposeB() ? " (w is [E, N, K])"
                                                 : " (w is [E, K, N])");
  return wantShape(*this, getResult(), {x[0], n}, "result");
}

LogicalResult MoeGroupedMatmulWgradOp::verify() {
  if (failed(wantRank(*this, getX(), 2, "x")) ||
      failed(wantRank(*this, getDy(), 2, "dy")) ||
      failed(wantRank(*this, getCounts(), 1, "counts")))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), dy = shapeOf(getDy());
  if (x[0] != dy[0])
    return emitOpError("x ") << shapeStr(x) << " and dy " << shapeStr(dy)
                             << " must have the same rows";
  return wantShape(*this, getResult(), {shapeOf(getCounts())[0], x[1], dy[1]},
                   "dw");
}

static LogicalResult verifyCoeff(Operation *op, double c) {
  if (!(c >= 0) || std::isinf(c))
    return op->emitOpError("coeff must be finite and >= 0, got ") << c;
  return success();
}

LogicalResult MoeAuxLossOp::verify() {
  if (failed(wantRank(*this, getLogits(), 2, "logits")) ||
      failed(wantRank(*this, getExperts(), 2, "experts")))
    return failure();
  if (shapeOf(getExperts())[0] != shapeOf(getLogits())[0] ||
      shapeOf(getExperts())[1] > shapeOf(getLogits())[1])
    return emitOpError("experts must be [N, k <= E] for logits ")
           << shapeStr(shapeOf(getLogits())) << ", got "
           << shapeStr(shapeOf(getExperts()));
  return verifyCoeff(*this, getCoeff().convertToDouble());
}
LogicalResult MoeAuxLossGradOp::verify() {
  if (failed(wantShape(*this, getResult(), shapeOf(getLogits()), "dlogits")))
    return failure();
  return verifyCoeff(*this, getCoeff().convertToDouble());
}
LogicalResult MoeZLossOp::verify() {
  if (failed(wantRank(*this, getLogits(), 2, "logits")))
    return failure();
  return verifyCoeff(*this, getCoeff().convertToDouble());
}
LogicalResult MoeZLossGradOp::verify() {
  if (failed(wantShape(*this, getResult(), shapeOf(getLogits()), "dlogits")))
    return failure();
  return verifyCoeff(*this, getCoeff().convertToDouble());
}

//===----------------------------------------------------------------------===//
// Cost
//===----------------------------------------------------------------------===//

uint64_t MoeRouterOp::getFlops() { return 5 * numel(getLogits()); }
uint64_t MoeRouterGradOp::getFlops() { return 4 * numel(getProbs()); }
uint64_t MoeAssignOp::getFlops() { return 0; }
uint64_t MoePermuteOp::getFlops() { return 0; }
uint64_t MoePermuteGradOp::getFlops() { return numel(getDy()); }
uint64_t MoeUnpermuteOp::getFlops() { return 2 * numel(getY()); }
uint64_t MoeUnpermuteGradOp::getFlops() { return 4 * numel(getY()); }
/// Upper bound: every row is multiplied (rows past Σ counts are not).
uint64_t MoeGroupedMatmulOp::getFlops() {
  return 2 * numel(getResult()) * (uint64_t)shapeOf(getX())[1];
}
uint64_t MoeGroupedMatmulWgradOp::getFlops() {
  return 2 * numel(getX()) * (uint64_t)shapeOf(getDy())[1];
}
uint64_t MoeAuxLossOp::getFlops() { return 5 * numel(getLogits()); }
uint64_t MoeAuxLossGradOp::getFlops() { return 8 * numel(getLogits()); }
uint64_t MoeZLossOp::getFlops() { return 4 * numel(getLogits()); }
uint64_t MoeZLossGradOp::getFlops() { return 6 * numel(getLogits()); }

//===----------------------------------------------------------------------===//
// Gradients
//===----------------------------------------------------------------------===//

LogicalResult MoeRouterOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  // Only probs is differentiable; experts is an integer result.
  if (!dys[0]) {
    grads.push_back(Value());
    return success();
  }
  grads.push_back(b.create<MoeRouterGradOp>(getLoc(), getLogits().getType(),
                                            dys[0], getProbs(), getExperts()));
  return success();
}

LogicalResult MoePermuteOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                          SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<MoePermuteGradOp>(getLoc(), getX().getType(),
                                             dys[0], getSlots()));
  grads.push_back(Value());
  return success();
}

LogicalResult MoeUnpermuteOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                            SmallVectorImpl<Value> &grads) {
  auto g = b.create<MoeUnpermuteGradOp>(
      getLoc(), TypeRange{getY().getType(), getProbs().getType()}, dys[0],
      getY(), getProbs(), getSlots());
  grads.append({g.getDy(), g.getDprobs(), Value()});
  return success();
}

LogicalResult MoeGroupedMatmulOp::buildGradient(OpBuilder &b,
                                                ArrayRef<Value> dys,
                                                SmallVectorImpl<Value> &grads) {
  Location loc = getLoc();
  // dx = dy·w[e]ᵀ per expert: the same grouped product with w transposed.
  grads.push_back(b.create<MoeGroupedMatmulOp>(loc, getX().getType(), dys[0],
                                               getW(), getCounts(),
                                               !getTransposeB()));
  // dw[e] = x_eᵀ·dy_e ([E, K, N]); with transpose_b, dy_eᵀ·x_e ([E, N, K]).
  Operation *dw =
      getTransposeB()
          ? b.create<MoeGroupedMatmulWgradOp>(loc, getW().getType(), dys[0],
                                              getX(), getCounts())
          : b.create<MoeGroupedMatmulWgradOp>(loc, getW().getType(), getX(),
                                              dys[0], getCounts());
  dw->setAttr(kWGrad, b.getUnitAttr());
  grads.push_back(dw->getResult(0));
  grads.push_back(Value());
  return success();
}

LogicalResult MoeAuxLossOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                          SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<MoeAuxLossGradOp>(getLoc(), getLogits().getType(),
                                             dys[0], getLogits(), getExperts(),
                                             getCoeffAttr()));
  grads.push_back(Value());
  return success();
}

LogicalResult MoeZLossOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                        SmallVectorImpl<Value> &grads) {
  grads.push_back(b.create<MoeZLossGradOp>(getLoc(), getLogits().getType(),
                                           dys[0], getLogits(), getCoeffAttr()));
  return success();
}

//===----------------------------------------------------------------------===//
// Expert parallelism: ep_dispatch / ep_combine
//===----------------------------------------------------------------------===//

/// Shared rules: `rows` (x of dispatch, y of combine) and `out` are
/// [rows, ...] alike past the row dimension; counts [E] with E divisible by
/// members; group and ranks exclusive, ranks of `members` distinct ranks.
static LogicalResult verifyExpertComm(Operation *op, Value rows, Value out,
                                      Value counts, int64_t members,
                                      std::optional<StringRef> group,
                                      std::optional<ArrayRef<int64_t>> ranks) {
  if (members < 1)
    return op->emitOpError("members must be >= 1 (the expert-parallel group "
                           "size), got ")
           << members;
  if (group && ranks)
    return op->emitOpError("takes a group or ranks, not both");
  if (group && *group != "ep" && *group != "dp" && *group != "tp" &&
      *group != "pp" && *group != "edp")
    return op->emitOpError("group must be tp, dp, pp, ep or edp, got \"")
           << *group << "\"";
  if (ranks) {
    if ((int64_t)ranks->size() != members)
      return op->emitOpError("ranks lists ")
             << ranks->size() << " ranks but members is " << members;
    llvm::SmallDenseSet<int64_t> seen;
    for (int64_t r : *ranks)
      if (r < 0 || !seen.insert(r).second)
        return op->emitOpError("ranks must be distinct ranks >= 0");
  }
  if (failed(wantRank(op, counts, 1, "counts")))
    return failure();
  int64_t e = shapeOf(counts)[0];
  if (e < 1)
    return op->emitOpError("counts must have one entry per expert, got ")
           << shapeStr(shapeOf(counts));
  if (e % members != 0)
    return op->emitOpError()
           << e << " experts cannot be split evenly over " << members
           << " members (num_moe_experts must be divisible by ep)";
  ArrayRef<int64_t> a = shapeOf(rows), b = shapeOf(out);
  if (a.empty() || b.empty())
    return op->emitOpError("rows must have rank >= 1");
  if (a.size() != b.size() || a.drop_front() != b.drop_front())
    return op->emitOpError("operand ")
           << shapeStr(a) << " and result " << shapeStr(b)
           << " must be [rows, ...] alike past the row dimension";
  if (a[0] < 1 || b[0] < 1)
    return op->emitOpError("row counts must be >= 1, got ")
           << shapeStr(a) << " and " << shapeStr(b);
  return success();
}

LogicalResult EpDispatchOp::verify() {
  if (failed(verifyExpertComm(*this, getX(), getY(), getCounts(), getMembers(),
                              getGroup(), getRanks())))
    return failure();
  if (Value lc = getLocalCounts()) {
    int64_t e = shapeOf(getCounts())[0];
    if (failed(wantShape(*this, lc, {e / (int64_t)getMembers()},
                         "local_counts")))
      return failure();
  }
  return success();
}

LogicalResult EpCombineOp::verify() {
  return verifyExpertComm(*this, getY(), getX(), getCounts(), getMembers(),
                          getGroup(), getRanks());
}

// Communication only: the bytes are the cost (getBytesRead/Written).
uint64_t EpDispatchOp::getFlops() { return 0; }
uint64_t EpCombineOp::getFlops() { return 0; }

// Each is the other's adjoint with the same counts and group.
LogicalResult EpDispatchOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                          SmallVectorImpl<Value> &grads) {
  if (!dys[0]) {
    grads.append({Value(), Value()});
    return success();
  }
  auto g = b.create<EpCombineOp>(getLoc(), getX().getType(), dys[0],
                                 getCounts(), getMembersAttr(), getGroupAttr(),
                                 getRanksAttr());
  grads.append({g.getX(), Value()});
  return success();
}

LogicalResult EpCombineOp::buildGradient(OpBuilder &b, ArrayRef<Value> dys,
                                         SmallVectorImpl<Value> &grads) {
  auto g = b.create<EpDispatchOp>(getLoc(), getY().getType(), Type(), dys[0],
                                  getCounts(), getMembersAttr(), getGroupAttr(),
                                  getRanksAttr());
  grads.append({g.getY(), Value()});
  return success();
}

// Verifiers, symbol checks and folders of the mapp ops.
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/PatternMatch.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <sstream>

using namespace mlir;
using namespace mapp;

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}
static Type elementOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getElementType();
}
static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  llvm::interleave(
      shape, [&](int64_t d) { s += std::to_string(d); }, [&] { s += ","; });
  return s + "]";
}

/// Operands and results named in `values` must share one element type.
static LogicalResult sameElementType(Operation *op, ValueRange values) {
  Type first;
  for (Value v : values) {
    Type t = elementOf(v);
    if (first && t != first)
      return op->emitOpError("expects one element type for its float tensors, "
                             "got ")
             << first << " and " << t;
    first = t;
  }
  return success();
}

static LogicalResult verifyNormParam(Operation *op, Value x, Value param,
                                     StringRef what) {
  ArrayRef<int64_t> xs = shapeOf(x), ps = shapeOf(param);
  if (xs.empty() || ps.size() != 1 || ps[0] != xs.back())
    return op->emitOpError() << what << " must be [" << (xs.empty() ? 0 : xs.back())
                             << "] to match the last dim of x, got "
                             << shapeStr(ps);
  return success();
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (getSymName().empty())
    return emitOpError("parameter name must not be empty");
  StringRef init = getInit();
  if (init != "normal" && init != "ones" && init != "zeros" &&
      init != "fp8_meta")
    return emitOpError("init must be \"normal\", \"ones\", \"zeros\" or "
                       "\"fp8_meta\", got \"")
           << init << "\"";
  if (auto std = getStdAttr(); std && std.getValueAsDouble() < 0)
    return emitOpError("std must be >= 0");
  auto type = cast<RankedTensorType>(getType());
  if (!type.hasStaticShape())
    return emitOpError("parameter shape must be static");
  if (getShardGroupAttr() && !getShardDimAttr())
    return emitOpError("shard_group needs shard_dim");
  if (auto dim = getShardDimAttr()) {
    if (dim.getInt() < 0 || dim.getInt() >= type.getRank())
      return emitOpError("shard_dim ")
             << dim.getInt() << " out of range for rank " << type.getRank();
    StringRef g = getShardGroupAttr() ? getShardGroupAttr().getValue() : "";
    if (g != "tp" && g != "dp" && g != "ep")
      return emitOpError("shard_group must be \"tp\", \"dp\" or \"ep\", got \"")
             << g << "\"";
  }
  if (auto blocks = getShardBlocksAttr()) {
    if (!getShardDimAttr())
      return emitOpError("shard_blocks needs shard_dim");
    if (blocks.getInt() <= 0 ||
        type.getShape()[getShardDimAttr().getInt()] % blocks.getInt() != 0)
      return emitOpError("shard_blocks (")
             << blocks.getInt() << ") must be > 0 and divide the shard dim";
  }
  return success();
}

/// Resolves `ref` to a mapp.param and checks its type against `expected`.
static LogicalResult verifyParamUse(Operation *op, FlatSymbolRefAttr ref,
                                    Type expected,
                                    SymbolTableCollection &tables) {
  auto param = tables.lookupNearestSymbolFrom<ParamOp>(op, ref.getAttr());
  if (!param)
    return op->emitOpError("refers to unknown parameter ") << ref;
  if (param.getType() != expected)
    return op->emitOpError("type ")
           << expected << " does not match parameter " << ref << " of type "
           << param.getType();
  return success();
}

LogicalResult ParamRefOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamUse(*this, getParamAttr(), getType(), tables);
}
LogicalResult GradAccumulateOp::verifySymbolUses(SymbolTableCollection &t) {
  return verifyParamUse(*this, getParamAttr(), getGrad().getType(), t);
}
LogicalResult GradRefOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamUse(*this, getParamAttr(), getType(), tables);
}
LogicalResult AdamWOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamUse(*this, getParamAttr(), getGrad().getType(), tables);
}
LogicalResult SGDOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamUse(*this, getParamAttr(), getGrad().getType(), tables);
}

LogicalResult GlobalNormOp::verify() {
  if (getGrads().empty())
    return emitOpError("needs at least one gradient");
  return success();
}

/// A number as people write it ("inf", "0.001"), not Diagnostic's "%e".
static std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

static LogicalResult verifySchedule(Operation *op, double lr, double minLr,
                                    StringRef kind, int64_t warmup,
                                    int64_t total, double maxNorm,
                                    bool hasNorm) {
  if (!(lr >= 0) || !std::isfinite(lr))
    return op->emitOpError("lr must be >= 0 and finite, got ") << number(lr);
  if (!(minLr >= 0 && minLr <= lr))
    return op->emitOpError("min_lr must be in [0, lr], got ") << number(minLr);
  if (kind != "constant" && kind != "cosine")
    return op->emitOpError("schedule must be \"constant\" or \"cosine\", got \"")
           << kind << "\"";
  if (warmup < 0 || total < 0)
    return op->emitOpError("warmup and total_steps must be >= 0");
  if (kind == "cosine" && total <= warmup)
    return op->emitOpError("cosine schedule needs total_steps (")
           << total << ") > warmup (" << warmup << ")";
  if (!(maxNorm >= 0) || !std::isfinite(maxNorm))
    return op->emitOpError("max_norm must be >= 0 and finite, got ")
           << number(maxNorm);
  if (hasNorm != (maxNorm > 0))
    return op->emitOpError("a clip operand and max_norm > 0 go together");
  return success();
}

LogicalResult AdamWOp::verify() {
  double b1 = getBeta1().convertToDouble(), b2 = getBeta2().convertToDouble();
  // Negated comparisons: NaN fails every one.
  if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
    return emitOpError("betas must be in [0, 1)");
  double eps = getEps().convertToDouble();
  if (!(eps > 0) || !std::isfinite(eps))
    return emitOpError("eps must be > 0 and finite");
  double wd = getWeightDecay().convertToDouble();
  if (!(wd >= 0) || !std::isfinite(wd))
    return emitOpError("weight_decay must be >= 0 and finite");
  return verifySchedule(*this, getLr().convertToDouble(),
                        getMinLr().convertToDouble(), getSchedule(),
                        getWarmupAttr().getInt(), getTotalStepsAttr().getInt(),
                        getMaxNorm().convertToDouble(), !!getNorm());
}

LogicalResult SGDOp::verify() {
  double momentum = getMomentum().convertToDouble();
  if (!(momentum >= 0) || !std::isfinite(momentum))
    return emitOpError("momentum must be >= 0 and finite");
  double wd = getWeightDecay().convertToDouble();
  if (!(wd >= 0) || !std::isfinite(wd))
    return emitOpError("weight_decay must be >= 0 and finite");
  return verifySchedule(*this, getLr().convertToDouble(),
                        getMinLr().convertToDouble(), getSchedule(),
                        getWarmupAttr().getInt(), getTotalStepsAttr().getInt(),
                        getMaxNorm().convertToDouble(), !!getNorm());
}

//===----------------------------------------------------------------------===//
// Compute
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::verify() {
  ArrayRef<int64_t> t = shapeOf(getTable()), ids = shapeOf(getIds()),
                    r = shapeOf(getResult());
  if (t.size() != 2)
    return emitOpError("table must be [vocab, hidden], got ") << shapeStr(t);
  SmallVector<int64_t> expected(ids.begin(), ids.end());
  expected.push_back(t[1]);
  if (r != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ")
           << shapeStr(expected) << " (ids shape + hidden), got " << shapeStr(r);
  return sameElementType(*this, {getTable(), getResult()});
}

LogicalResult EmbeddingGradOp::verify() {
  ArrayRef<int64_t> dy = shapeOf(getDy()), ids = shapeOf(getIds()),
                    r = shapeOf(getResult());
  if (dy.size() != ids.size() + 1 || dy.drop_back() != ids)
    return emitOpError("dy must be ids shape + [hidden], got ")
           << shapeStr(dy) << " for ids " << shapeStr(ids);
  if (getVocabAttr().getInt() <= 0)
    return emitOpError("vocab must be > 0");
  if (r.size() != 2 || r[0] != getVocabAttr().getInt() || r[1] != dy.back())
    return emitOpError("result must be [vocab, hidden] = [")
           << getVocabAttr().getInt() << "," << dy.back() << "], got "
           << shapeStr(r);
  return sameElementType(*this, {getDy(), getResult()});
}

LogicalResult LinearOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX()), w = shapeOf(getW()),
                    r = shapeOf(getResult());
  if (w.size() != 2)
    return emitOpError("weight must be [out, in], got ") << shapeStr(w);
  if (x.empty() || x.back() != w[1])
    return emitOpError("x's last dim must equal weight's in-features ")
           << w[1] << ", got x " << shapeStr(x);
  SmallVector<int64_t> expected(x.begin(), x.end());
  expected.back() = w[0];
  if (r != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(r);
  if (getBias()) {
    ArrayRef<int64_t> b = shapeOf(getBias());
    if (b.size() != 1 || b[0] != w[0])
      return emitOpError("bias must be [") << w[0] << "], got " << shapeStr(b);
  }
  return sameElementType(*this, getOperation()->getOperands());
}

LogicalResult MatmulOp::verify() {
  ArrayRef<int64_t> a = shapeOf(getA()), b = shapeOf(getB()),
                    r = shapeOf(getResult());
  if (a.size() < 2 || b.size() < 2)
    return emitOpError("operands must have rank >= 2");
  if (b.size() != 2 && b.size() != a.size())
    return emitOpError("b must be 2-d or batched like a (rank ")
           << a.size() << "), got rank " << b.size();
  if (b.size() == a.size() && a.drop_back(2) != b.drop_back(2))
    return emitOpError("batch dims differ: ")
           << shapeStr(a.drop_back(2)) << " vs " << shapeStr(b.drop_back(2));
  int64_t m = getTransposeA() ? a.back() : a[a.size() - 2];
  int64_t ka = getTransposeA() ? a[a.size() - 2] : a.back();
  int64_t kb = getTransposeB() ? b.back() : b[b.size() - 2];
  int64_t n = getTransposeB() ? b[b.size() - 2] : b.back();
  if (ka != kb)
    return emitOpError("contraction dims differ: ") << ka << " vs " << kb;
  SmallVector<int64_t> expected(a.drop_back(2));
  expected.append({m, n});
  if (r != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(r);
  return sameElementType(*this, getOperation()->getOperands());
}

//===----------------------------------------------------------------------===//
// FP8
//===----------------------------------------------------------------------===//

static bool isFp8Format(StringRef f) { return f == "e4m3" || f == "e5m2"; }

/// The fp8 operand formats, meta rows and the meta's layout (f32[3·(1+H)]).
static LogicalResult verifyFp8(Operation *op, Value meta, StringRef fa,
                               StringRef fb, int64_t ra, int64_t rb) {
  for (StringRef f : {fa, fb})
    if (!isFp8Format(f))
      return op->emitOpError("fp8 format must be \"e4m3\" or \"e5m2\", got \"")
             << f << "\"";
  if (fa == "e5m2" && fb == "e5m2")
    return op->emitOpError("an e5m2 x e5m2 product has no fp8 GEMM (one operand "
                           "must be e4m3)");
  ArrayRef<int64_t> m = shapeOf(meta);
  if (m.size() != 1 || m[0] < 6 || m[0] % 3 != 0 || !elementOf(meta).isF32())
    return op->emitOpError("meta must be f32[3 * (1 + history)], got ")
           << meta.getType();
  for (int64_t r : {ra, rb})
    if (r < 0 || r > 2)
      return op->emitOpError("meta rows are 0, 1 or 2, got ") << r;
  return success();
}

LogicalResult Fp8LinearOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX()), w = shapeOf(getW()),
                    r = shapeOf(getResult());
  if (w.size() != 2 || x.empty() || x.back() != w[1])
    return emitOpError("weight must be [out, in] with in = x's last dim, got x ")
           << shapeStr(x) << ", weight " << shapeStr(w);
  SmallVector<int64_t> expected(x.begin(), x.end());
  expected.back() = w[0];
  if (r != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(r);
  if (getBias() && shapeOf(getBias()) != ArrayRef<int64_t>{w[0]})
    return emitOpError("bias must be [") << w[0] << "]";
  return verifyFp8(*this, getMeta(), getFp8A(), getFp8B(),
                   static_cast<int64_t>(getMetaA()),
                   static_cast<int64_t>(getMetaB()));
}

LogicalResult Fp8MatmulOp::verify() {
  ArrayRef<int64_t> a = shapeOf(getA()), b = shapeOf(getB()),
                    r = shapeOf(getResult());
  if (a.size() < 2 || b.size() != 2 || (getTransposeA() && a.size() != 2))
    return emitOpError("a must have rank >= 2 (exactly 2 with transpose_a) and "
                       "b rank 2");
  int64_t m = getTransposeA() ? a.back() : a[a.size() - 2];
  int64_t ka = getTransposeA() ? a[0] : a.back();
  if (ka != b[0])
    return emitOpError("contraction dims differ: ") << ka << " vs " << b[0];
  SmallVector<int64_t> expected(a.drop_back(2));
  expected.append({m, b[1]});
  if (r != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(r);
  return verifyFp8(*this, getMeta(), getFp8A(), getFp8B(),
                   static_cast<int64_t>(getMetaA()),
                   static_cast<int64_t>(getMetaB()));
}

LogicalResult Fp8UpdateOp::verify() {
  // I64Attr getters are unsigned: read them signed.
  int64_t history = static_cast<int64_t>(getHistory());
  int64_t margin = static_cast<int64_t>(getMargin());
  if (history < 1)
    return emitOpError("history must be >= 1, got ") << history;
  if (margin < 0)
    return emitOpError("margin must be >= 0, got ") << margin;
  for (StringRef f : {getFormatX(), getFormatW(), getFormatDy()})
    if (!isFp8Format(f))
      return emitOpError("fp8 format must be \"e4m3\" or \"e5m2\", got \"")
             << f << "\"";
  return success();
}

LogicalResult Fp8UpdateOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto param = tables.lookupNearestSymbolFrom<ParamOp>(*this, getParamAttr().getAttr());
  if (!param)
    return emitOpError("refers to unknown parameter ") << getParamAttr();
  auto t = cast<RankedTensorType>(param.getType());
  if (t.getRank() != 1 || t.getDimSize(0) != 3 * (1 + getHistory()) ||
      !t.getElementType().isF32())
    return emitOpError("parameter ")
           << getParamAttr() << " must be f32[" << 3 * (1 + getHistory())
           << "] (3 rows of scale + history " << getHistory() << "), got "
           << param.getType();
  return success();
}

/// reduce_sum / reduce_max: `dims` sorted, unique, in range, and removed
/// from the result's shape.
static LogicalResult verifyReduction(Operation *op, Value x, Value result,
                                     ArrayRef<int64_t> dims) {
  ArrayRef<int64_t> xs = shapeOf(x);
  SmallVector<int64_t> expected;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= (int64_t)xs.size())
      return op->emitOpError("dim ") << dims[i] << " out of range for rank "
                                     << xs.size();
    if (i && dims[i] <= dims[i - 1])
      return op->emitOpError("dims must be sorted and unique");
  }
  for (int64_t i = 0; i < (int64_t)xs.size(); ++i)
    if (!llvm::is_contained(dims, i))
      expected.push_back(xs[i]);
  if (shapeOf(result) != ArrayRef<int64_t>(expected))
    return op->emitOpError("result must be ")
           << shapeStr(expected) << ", got " << shapeStr(shapeOf(result));
  return success();
}

LogicalResult ReduceSumOp::verify() {
  return verifyReduction(*this, getX(), getResult(), getDims());
}

OpFoldResult ReduceSumOp::fold(FoldAdaptor) {
  if (getDims().empty() && getX().getType() == getType())
    return getX();
  return {};
}

static LogicalResult verifyBroadcast(Operation *op, Value lhs, Value rhs,
                                     Value result) {
  ArrayRef<int64_t> l = shapeOf(lhs), r = shapeOf(rhs);
  if (r.size() > l.size() || l.take_back(r.size()) != r)
    return op->emitOpError("rhs shape ")
           << shapeStr(r) << " must be a suffix of lhs shape " << shapeStr(l);
  if (result.getType() != lhs.getType())
    return op->emitOpError("result type must equal lhs type ")
           << lhs.getType();
  return sameElementType(op, {lhs, rhs});
}

LogicalResult AddOp::verify() {
  return verifyBroadcast(*this, getLhs(), getRhs(), getResult());
}
LogicalResult MulOp::verify() {
  return verifyBroadcast(*this, getLhs(), getRhs(), getResult());
}

OpFoldResult ScaleOp::fold(FoldAdaptor) {
  if (getFactor().convertToDouble() == 1.0)
    return getX();
  return {};
}

namespace {
/// scale(scale(x, a), b) -> scale(x, a*b).
struct FoldScaleChain : OpRewritePattern<ScaleOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(ScaleOp op,
                                PatternRewriter &rewriter) const override {
    auto inner = op.getX().getDefiningOp<ScaleOp>();
    if (!inner)
      return failure();
    double factor =
        op.getFactor().convertToDouble() * inner.getFactor().convertToDouble();
    rewriter.replaceOpWithNewOp<ScaleOp>(op, op.getType(), inner.getX(),
                                         rewriter.getF64FloatAttr(factor));
    return success();
  }
};
} // namespace

void ScaleOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                          MLIRContext *context) {
  results.add<FoldScaleChain>(context);
}

LogicalResult GeluOp::verify() {
  if (getApproximate() != "none" && getApproximate() != "tanh")
    return emitOpError("approximate must be \"none\" or \"tanh\", got \"")
           << getApproximate() << "\"";
  return success();
}

LogicalResult LayerNormOp::verify() {
  if (getEps().convertToDouble() <= 0)
    return emitOpError("eps must be > 0");
  if (getResult().getType() != getX().getType())
    return emitOpError("result type must equal x's type");
  if (failed(verifyNormParam(*this, getX(), getGamma(), "gamma")) ||
      failed(verifyNormParam(*this, getX(), getBeta(), "beta")))
    return failure();
  return sameElementType(*this, getOperation()->getOperands());
}

LogicalResult RMSNormOp::verify() {
  if (getEps().convertToDouble() <= 0)
    return emitOpError("eps must be > 0");
  if (getResult().getType() != getX().getType())
    return emitOpError("result type must equal x's type");
  if (failed(verifyNormParam(*this, getX(), getGamma(), "gamma")))
    return failure();
  return sameElementType(*this, getOperation()->getOperands());
}

LogicalResult AttentionOp::verify() {
  ArrayRef<int64_t> q = shapeOf(getQ());
  if (q.size() != 3)
    return emitOpError("q must be [batch, seq, hidden], got ") << shapeStr(q);
  ArrayRef<int64_t> k = shapeOf(getK());
  if (k.size() != 3 || k[0] != q[0] || k[1] != q[1] || shapeOf(getV()) != k ||
      getK().getType() != getV().getType() ||
      getResult().getType() != getQ().getType())
    return emitOpError("k and v must be one type [batch, seq, kv_hidden] "
                       "and the result q's type");
  int64_t heads = getHeadsAttr().getInt();
  if (heads <= 0 || q[2] % heads != 0)
    return emitOpError("heads (")
           << heads << ") must be > 0 and divide hidden (" << q[2] << ")";
  // Grouped-query attention: k and v hold kv_heads heads of the same D.
  int64_t d = q[2] / heads;
  if (k[2] == 0 || k[2] % d != 0 || heads % (k[2] / d) != 0)
    return emitOpError("k/v width ")
           << k[2] << " must be a number of key/value heads of " << d
           << " columns dividing heads (" << heads << ")";
  if (getRotary() && (q[2] / heads) % 2 != 0)
    return emitOpError("rotary needs an even head dim, got ") << q[2] / heads;
  if (getScale().convertToDouble() <= 0)
    return emitOpError("scale must be > 0");
  if (std::optional<uint64_t> rd = getRotaryDim()) {
    int64_t r = static_cast<int64_t>(*rd);
    if (!getRotary())
      return emitOpError("rotary_dim needs rotary");
    if (r <= 0 || r % 2 != 0 || r > d)
      return emitOpError("rotary_dim must be even and in (0, head dim ")
             << d << "], got " << r;
  }
  if (std::optional<APFloat> cap = getSoftcap(); cap && !(cap->convertToDouble() > 0))
    return emitOpError("softcap must be > 0");
  if (std::optional<uint64_t> w = getSlidingWindow()) {
    if (static_cast<int64_t>(*w) <= 0)
      return emitOpError("sliding_window must be > 0");
    if (!getCausal())
      return emitOpError("sliding_window needs causal");
  }
  if (std::optional<APFloat> p = getDropout()) {
    double v = p->convertToDouble();
    if (!(v >= 0 && v < 1))
      return emitOpError("dropout must be in [0, 1), got ") << v;
    if (!getDropoutSeed())
      return emitOpError("dropout needs dropout_seed");
  }
  return success();
}

LogicalResult SoftcapOp::verify() {
  if (!(getCap().convertToDouble() > 0))
    return emitOpError("cap must be > 0, got ") << getCap().convertToDouble();
  return success();
}

LogicalResult DropoutOp::verify() {
  double p = getP().convertToDouble();
  if (!(p >= 0 && p < 1))
    return emitOpError("p must be in [0, 1), got ") << p;
  return success();
}

OpFoldResult DropoutOp::fold(FoldAdaptor) {
  if (getP().convertToDouble() == 0.0)
    return getX();
  return {};
}

LogicalResult CrossEntropyOp::verify() {
  ArrayRef<int64_t> l = shapeOf(getLogits()), t = shapeOf(getTargets());
  if (l.size() != t.size() + 1 || l.drop_back() != t)
    return emitOpError("logits must be targets shape + [vocab], got ")
           << shapeStr(l) << " for targets " << shapeStr(t);
  return success();
}

static LogicalResult verifyGroupName(Operation *op, StringRef g) {
  if (g != "tp" && g != "dp" && g != "pp" && g != "ep" &&
      g != "edp")
    return op->emitOpError("group must be tp, dp, pp, ep or edp, got \"")
           << g << "\"";
  return success();
}

LogicalResult ReduceMaxOp::verify() {
  return verifyReduction(*this, getX(), getResult(), getDims());
}

LogicalResult VocabCEPartialsOp::verify() {
  ArrayRef<int64_t> l = shapeOf(getLogits()), t = shapeOf(getTargets());
  if (l.size() != t.size() + 1 || l.drop_back() != t)
    return emitOpError("logits must be targets shape + [vocab shard], got ")
           << shapeStr(l) << " for targets " << shapeStr(t);
  if (shapeOf(getRowmax()) != t)
    return emitOpError("rowmax must have the targets' shape ") << shapeStr(t);
  SmallVector<int64_t> expected(t.begin(), t.end());
  expected.push_back(2);
  if (shapeOf(getResult()) != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected);
  return verifyGroupName(*this, getGroup());
}

LogicalResult CEFromPartialsOp::verify() {
  ArrayRef<int64_t> p = shapeOf(getPartials()), t = shapeOf(getTargets());
  if (p.size() != t.size() + 1 || p.drop_back() != t || p.back() != 2)
    return emitOpError("partials must be targets shape + [2], got ")
           << shapeStr(p) << " for targets " << shapeStr(t);
  return success();
}

LogicalResult ScatterToGroupOp::verify() {
  if (failed(verifyGroupName(*this, getGroup())))
    return failure();
  ArrayRef<int64_t> x = shapeOf(getX()), r = shapeOf(getResult());
  int64_t dim = getDimAttr().getInt();
  if (dim < 0 || dim >= (int64_t)x.size() || x.size() != r.size())
    return emitOpError("dim ") << dim << " out of range or ranks differ";
  for (size_t i = 0; i < x.size(); ++i)
    if ((int64_t)i != dim && x[i] != r[i])
      return emitOpError("shapes may differ only along dim ") << dim;
  if (r[dim] <= 0 || x[dim] % r[dim] != 0)
    return emitOpError("dim ") << x[dim] << " must be a multiple of the slice "
                               << r[dim];
  return success();
}

LogicalResult GradSyncOp::verify() {
  if (!!getGroup() == !!getRanks())
    return emitOpError("needs exactly one of `group` or `ranks`");
  if (getGroup() && failed(verifyGroupName(*this, *getGroup())))
    return failure();
  if (getMode() != "all_reduce" && getMode() != "reduce_scatter")
    return emitOpError("mode must be all_reduce or reduce_scatter, got \"")
           << getMode() << "\"";
  if (getReduction() != "sum" && getReduction() != "avg")
    return emitOpError("reduction must be sum or avg, got \"")
           << getReduction() << "\"";
  if (getParams().empty())
    return emitOpError("needs at least one parameter");
  return success();
}

/// Every entry of a bucket's parameter list names a mapp.param, once.
static LogicalResult verifyParamList(Operation *op, ArrayAttr params,
                                     SymbolTableCollection &tables) {
  llvm::SmallDenseSet<Attribute> seen;
  for (Attribute a : params) {
    auto ref = cast<FlatSymbolRefAttr>(a);
    if (!tables.lookupNearestSymbolFrom<ParamOp>(op, ref.getAttr()))
      return op->emitOpError("refers to unknown parameter ") << ref;
    if (!seen.insert(a).second)
      return op->emitOpError("lists parameter ") << ref << " twice";
  }
  return success();
}

LogicalResult GradSyncOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamList(*this, getParams(), tables);
}
LogicalResult ParamGatherOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyParamList(*this, getParams(), tables);
}

LogicalResult ReshapeOp::verify() {
  auto in = cast<RankedTensorType>(getX().getType());
  auto out = cast<RankedTensorType>(getType());
  if (in.getElementType() != out.getElementType())
    return emitOpError("cannot change the element type");
  if (in.hasStaticShape() && out.hasStaticShape() &&
      in.getNumElements() != out.getNumElements())
    return emitOpError("element count changes from ")
           << in.getNumElements() << " to " << out.getNumElements();
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor) {
  if (getX().getType() == getType())
    return getX();
  // reshape(reshape(x)) -> reshape(x): only the final shape matters.
  if (auto inner = getX().getDefiningOp<ReshapeOp>()) {
    getXMutable().assign(inner.getX());
    return getResult();
  }
  return {};
}

LogicalResult TransposeOp::verify() {
  ArrayRef<int64_t> x = shapeOf(getX()), perm = getPerm();
  if (perm.size() != x.size())
    return emitOpError("perm has ") << perm.size() << " entries for rank "
                                    << x.size();
  SmallVector<int64_t> expected;
  llvm::SmallDenseSet<int64_t> seen;
  for (int64_t p : perm) {
    if (p < 0 || p >= (int64_t)x.size() || !seen.insert(p).second)
      return emitOpError("perm must be a permutation of 0..") << x.size() - 1;
    expected.push_back(x[p]);
  }
  if (shapeOf(getResult()) != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(shapeOf(getResult()));
  return success();
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  ArrayRef<int64_t> perm = getPerm();
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i)
    identity &= perm[i] == (int64_t)i;
  if (identity)
    return getX();
  // transpose(transpose(x, p1), p2) -> transpose(x, p1∘p2).
  if (auto inner = getX().getDefiningOp<TransposeOp>()) {
    ArrayRef<int64_t> p1 = inner.getPerm();
    SmallVector<int64_t> composed;
    for (int64_t p : perm)
      composed.push_back(p1[p]);
    getXMutable().assign(inner.getX());
    setPerm(composed);
    return getResult();
  }
  return {};
}

static LogicalResult verifySliceLike(Operation *op, ArrayRef<int64_t> full,
                                     ArrayRef<int64_t> part, int64_t dim,
                                     int64_t start, int64_t end) {
  if (dim < 0 || dim >= (int64_t)full.size())
    return op->emitOpError("dim ") << dim << " out of range for rank "
                                   << full.size();
  if (start < 0 || end > full[dim] || start >= end)
    return op->emitOpError("range [")
           << start << ", " << end << ") is empty or outside [0, " << full[dim]
           << ")";
  SmallVector<int64_t> expected(full.begin(), full.end());
  expected[dim] = end - start;
  if (part != ArrayRef<int64_t>(expected))
    return op->emitOpError("slice shape must be ")
           << shapeStr(expected) << ", got " << shapeStr(part);
  return success();
}

LogicalResult SliceOp::verify() {
  return verifySliceLike(*this, shapeOf(getX()), shapeOf(getResult()),
                         getDimAttr().getInt(), getStartAttr().getInt(),
                         getEndAttr().getInt());
}

OpFoldResult SliceOp::fold(FoldAdaptor) {
  if (getX().getType() == getType())
    return getX();
  return {};
}

LogicalResult SliceGradOp::verify() {
  ArrayRef<int64_t> dy = shapeOf(getDy());
  int64_t dim = getDimAttr().getInt();
  if (dim < 0 || dim >= (int64_t)dy.size())
    return emitOpError("dim ") << dim << " out of range for rank " << dy.size();
  return verifySliceLike(*this, shapeOf(getResult()), dy, dim,
                         getStartAttr().getInt(),
                         getStartAttr().getInt() + dy[dim]);
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  ArrayRef<int64_t> first = shapeOf(getInputs()[0]);
  int64_t dim = getDimAttr().getInt();
  if (dim < 0 || dim >= (int64_t)first.size())
    return emitOpError("dim ") << dim << " out of range for rank "
                               << first.size();
  SmallVector<int64_t> expected(first.begin(), first.end());
  expected[dim] = 0;
  for (Value in : getInputs()) {
    ArrayRef<int64_t> s = shapeOf(in);
    if (s.size() != first.size())
      return emitOpError("inputs must share one rank");
    for (size_t i = 0; i < s.size(); ++i)
      if ((int64_t)i != dim && s[i] != first[i])
        return emitOpError("inputs differ outside dim ") << dim;
    expected[dim] += s[dim];
  }
  if (shapeOf(getResult()) != ArrayRef<int64_t>(expected))
    return emitOpError("result must be ") << shapeStr(expected) << ", got "
                                          << shapeStr(shapeOf(getResult()));
  return sameElementType(*this, getOperation()->getOperands());
}

#define GET_OP_CLASSES
#include "mapp/Dialect/Mapp/IR/MappOps.cpp.inc"

// --mapp-decompose-norms (issue 37): rms_norm and layer_norm written with
// the tensor algebra, as the exporter writes a norm it does not recognize,
// so that --mapp-autodiff differentiates the pieces and --mapp-fuse makes
// each norm one generated row program, forward and backward
// (docs/fusion.md, "Norms from the algebra"). Runs before autodiff.
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "mapp/Transforms/Passes.h"

namespace mapp {
#define GEN_PASS_DEF_MAPPDECOMPOSENORMS
#include "mapp/Transforms/Passes.h.inc"
} // namespace mapp

using namespace mlir;
using namespace mapp;

namespace {

/// Builds ops before a norm, each carrying the norm's placement and name
/// attributes (its layer, stage, probe point), so the passes after see the
/// pieces where they saw the norm.
struct Writer {
  OpBuilder b;
  Operation *norm;
  Location loc;
  Writer(Operation *op) : b(op), norm(op), loc(op->getLoc()) {}

  template <typename Op, typename... Args> Value make(Type t, Args &&...args) {
    Operation *op = b.create<Op>(loc, t, std::forward<Args>(args)...);
    for (NamedAttribute na : norm->getDiscardableAttrs())
      op->setAttr(na.getName(), na.getValue());
    return op->getResult(0);
  }
  RankedTensorType like(Value v, ArrayRef<int64_t> shape) {
    return RankedTensorType::get(shape, cast<RankedTensorType>(v.getType()).getElementType());
  }
  Value scalar(Value like_, double v) {
    return make<FillOp>(like(like_, {}), b.getF64FloatAttr(v));
  }
  /// The sum over the last dim of x with the dim kept as 1, times `factor`.
  Value rowMean(Value x) {
    ArrayRef<int64_t> s = cast<RankedTensorType>(x.getType()).getShape();
    SmallVector<int64_t> rows(s.drop_back()), kept(rows);
    kept.push_back(1);
    int64_t last = static_cast<int64_t>(s.size()) - 1;
    Value sum = make<ReduceSumOp>(like(x, rows), x, b.getDenseI64ArrayAttr({last}));
    Value k = make<ReshapeOp>(like(x, kept), sum);
    return make<ScaleOp>(k.getType(), k, b.getF64FloatAttr(1.0 / s.back()));
  }
  /// rsqrt(v + eps) of a [..., 1] row value, broadcast back to x's shape.
  Value invStd(Value v, double eps, Value x) {
    Value e = make<AddOp>(v.getType(), v, scalar(x, eps));
    Value r = make<RsqrtOp>(v.getType(), e);
    return make<BroadcastOp>(x.getType(), r);
  }
};

void decompose(RMSNormOp op) {
  Writer w(op);
  Value x = op.getX(), gamma = op.getGamma();
  Value sq = w.make<PowOp>(x.getType(), x, w.b.getF64FloatAttr(2.0));
  Value n = w.make<MulOp>(x.getType(), x, w.invStd(w.rowMean(sq), op.getEps().convertToDouble(), x));
  double offset = op.getWeightOffset().convertToDouble();
  if (offset != 0) // Gemma's gain, 1 + weight
    gamma = w.make<AddOp>(gamma.getType(), gamma, w.scalar(gamma, offset));
  op.replaceAllUsesWith(w.make<MulOp>(x.getType(), n, gamma));
  op.erase();
}

void decompose(LayerNormOp op) {
  Writer w(op);
  Value x = op.getX();
  Value mean = w.make<BroadcastOp>(x.getType(), w.rowMean(x));
  Value xc = w.make<SubOp>(x.getType(), x, mean);
  Value sq = w.make<MulOp>(x.getType(), xc, xc);
  Value n = w.make<MulOp>(x.getType(), xc, w.invStd(w.rowMean(sq), op.getEps().convertToDouble(), x));
  Value scaled = w.make<MulOp>(x.getType(), n, op.getGamma());
  op.replaceAllUsesWith(w.make<AddOp>(x.getType(), scaled, op.getBeta()));
  op.erase();
}

struct DecomposeNormsPass : mapp::impl::MappDecomposeNormsBase<DecomposeNormsPass> {
  void runOnOperation() override {
    SmallVector<Operation *> norms;
    getOperation()->walk([&](Operation *op) {
      if (isa<RMSNormOp, LayerNormOp>(op))
        norms.push_back(op);
    });
    for (Operation *op : norms) {
      if (auto r = dyn_cast<RMSNormOp>(op))
        decompose(r);
      else
        decompose(cast<LayerNormOp>(op));
    }
  }
};

} // namespace

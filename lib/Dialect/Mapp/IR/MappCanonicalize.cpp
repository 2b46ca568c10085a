//===- MappCanonicalize.cpp - sums of disjoint slice gradients ------------===//
//
// Autodiff sums the gradient contributions of a value read by several ops.
// When those reads are slices of disjoint windows (the fused qkv projection's
// three slices), every contribution is a slice_grad — a full-size tensor of
// zeros with one window written — and the sum is two full-size adds. Here
//   add(slice_grad(a), slice_grad(b))  ->  concat(zeros, a, zeros, b, ...)
//   add(concat(.., zeros, ..), slice_grad(c))  ->  the zeros replaced by c
// so the whole sum becomes one concat that writes every element once. Adding
// exact zeros changes no value, so the rewrite is exact (up to the sign of a
// zero: 0 + -0 is +0, a concat keeps -0).
//
//===----------------------------------------------------------------------===//
#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mapp;

namespace {

/// A window [begin, end) of a sum term along its dim: `value`, or zeros when
/// null.
struct Window {
  int64_t begin, end;
  Value value;
};

bool isZeroFill(Value v) {
  auto fill = v.getDefiningOp<FillOp>();
  return fill && fill.getValue().convertToDouble() == 0.0;
}

/// The windows of a term the rewrite may absorb: a slice_grad, or a concat
/// that still holds zeros. Only a term with no other reader is absorbed
/// (otherwise the old op stays alive and the work is done twice).
std::optional<SmallVector<Window>> windowsOf(Value term, int64_t &dim) {
  if (!term.hasOneUse())
    return std::nullopt;
  auto type = cast<RankedTensorType>(term.getType());
  SmallVector<Window> ws;
  if (auto sg = term.getDefiningOp<SliceGradOp>()) {
    dim = sg.getDim();
    int64_t size = type.getDimSize(dim);
    int64_t start = sg.getStart();
    int64_t len = cast<RankedTensorType>(sg.getDy().getType()).getDimSize(dim);
    if (start > 0)
      ws.push_back({0, start, Value()});
    ws.push_back({start, start + len, sg.getDy()});
    if (start + len < size)
      ws.push_back({start + len, size, Value()});
    return ws;
  }
  auto cat = term.getDefiningOp<ConcatOp>();
  if (!cat || !llvm::any_of(cat.getInputs(), isZeroFill))
    return std::nullopt;
  dim = cat.getDim();
  int64_t at = 0;
  for (Value in : cat.getInputs()) {
    int64_t len = cast<RankedTensorType>(in.getType()).getDimSize(dim);
    ws.push_back({at, at + len, isZeroFill(in) ? Value() : in});
    at += len;
  }
  return ws;
}

/// The window of `ws` holding position x (ws covers the dim in order).
const Window &windowAt(ArrayRef<Window> ws, int64_t x) {
  return *llvm::find_if(ws, [&](const Window &w) { return x < w.end; });
}

/// Merges two window lists when no position holds a value in both; adjacent
/// zero windows coalesce. Empty on a collision.
std::optional<SmallVector<Window>> merge(ArrayRef<Window> a,
                                         ArrayRef<Window> b) {
  SmallVector<int64_t> cuts;
  for (ArrayRef<Window> ws : {a, b})
    for (const Window &w : ws)
      cuts.push_back(w.begin);
  llvm::sort(cuts);
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  int64_t size = a.back().end;
  SmallVector<Window> out;
  for (size_t i = 0; i < cuts.size(); ++i) {
    int64_t lo = cuts[i], hi = i + 1 < cuts.size() ? cuts[i + 1] : size;
    const Window &wa = windowAt(a, lo), &wb = windowAt(b, lo);
    if (wa.value && wb.value)
      return std::nullopt;
    const Window &w = wa.value ? wa : wb;
    // A value window cut by the other list's boundaries joins up again.
    if (!out.empty() && out.back().value == w.value &&
        (!w.value || out.back().begin == w.begin)) {
      out.back().end = hi;
      continue;
    }
    out.push_back({w.value ? w.begin : lo, hi, w.value});
  }
  return out;
}

struct FoldSliceGradSum : OpRewritePattern<AddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AddOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getLhs().getType() != op.getRhs().getType())
      return failure(); // a broadcast add
    int64_t dimA = -1, dimB = -1;
    auto a = windowsOf(op.getLhs(), dimA), b = windowsOf(op.getRhs(), dimB);
    if (!a || !b || dimA != dimB)
      return failure();
    auto merged = merge(*a, *b);
    if (!merged)
      return failure();
    auto type = cast<RankedTensorType>(op.getType());
    SmallVector<Value> inputs;
    for (const Window &w : *merged) {
      if (w.value) {
        inputs.push_back(w.value);
        continue;
      }
      SmallVector<int64_t> shape(type.getShape());
      shape[dimA] = w.end - w.begin;
      inputs.push_back(rewriter.create<FillOp>(
          op.getLoc(), RankedTensorType::get(shape, type.getElementType()),
          rewriter.getF64FloatAttr(0.0)));
    }
    Operation *lhs = op.getLhs().getDefiningOp();
    Operation *rhs = op.getRhs().getDefiningOp();
    auto cat = rewriter.create<ConcatOp>(op.getLoc(), type, inputs,
                                         rewriter.getI64IntegerAttr(dimA));
    // Names and `mapp.grad_of` (probes address gradients by it) move along.
    cat->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    rewriter.replaceOp(op, cat.getResult());
    for (Operation *term : {lhs, rhs}) {
      if (!term->use_empty())
        continue;
      SmallVector<Operation *> fills;
      for (Value in : term->getOperands())
        if (isZeroFill(in))
          fills.push_back(in.getDefiningOp());
      rewriter.eraseOp(term);
      for (Operation *fill : fills)
        if (fill->use_empty())
          rewriter.eraseOp(fill);
    }
    return success();
  }
};

} // namespace

void AddOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                        MLIRContext *context) {
  results.add<FoldSliceGradSum>(context);
}

//===- MoeKernelSpecs.cpp - operand rules of the MoE kernels --------------===//
//
// The load-time half of the MoE ops' verifiers (MappMoeOps.cpp): shapes,
// dtypes and attributes, so no plan can make a MoE kernel read or write
// outside its operands. Data (expert ids, slots, counts) is the kernels'.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "MoeKernelChecks.h"

#include <cmath>

using namespace mapp::rt;
using TT = TensorType;
using TTs = std::vector<TensorType>;

namespace {

std::string desc(const TT &t) {
  return std::string(dtypeName(t.dtype)) + shapeStr(t.shape);
}
void want(const TT &t, DType d, int rank, const char *what) {
  if (t.dtype != d || t.rank() != rank)
    fail(what, " must be ", dtypeName(d), " of rank ", rank, ", got ",
         desc(t));
}
void wantShape(const TT &t, const Shape &s, const char *what) {
  if (t.shape != s)
    fail(what, " must have shape ", shapeStr(s), ", got ", desc(t));
}
void wantCoeff(const Attrs &a) {
  double c = a.requireFloat("coeff");
  if (!(c >= 0) || std::isinf(c))
    fail("coeff must be finite and >= 0, got ", c);
}
/// choices: [N, k] i32 experts or slots, like `like` (probs).
void wantChoices(const TT &t, const TT &like, const char *what) {
  want(t, DType::I32, 2, what);
  wantShape(t, like.shape, what);
}

} // namespace

// The checks KernelVocab.def names (moe::check...).
namespace mapp::rt::moe {

void checkRouter(const Attrs &a, const TTs &in, const TTs &out) {
  want(in[0], DType::F32, 2, "logits");
  int64_t k = a.getInt("topk", 0), n = in[0].dim(0), e = in[0].dim(1);
  if (k < 1 || k > e)
    fail("topk must be in [1, ", e, "] (the expert count), got ", k);
  want(out[0], DType::F32, 2, "probs");
  wantShape(out[0], {n, k}, "probs");
  wantChoices(out[1], out[0], "experts");
}
void checkRouterGrad(const Attrs &, const TTs &in, const TTs &out) {
  want(in[1], DType::F32, 2, "probs");
  want(in[0], DType::F32, 2, "dprobs");
  wantShape(in[0], in[1].shape, "dprobs");
  wantChoices(in[2], in[1], "experts");
  want(out[0], DType::F32, 2, "dlogits");
  if (out[0].dim(0) != in[1].dim(0) || out[0].dim(1) < in[1].dim(1))
    fail("dlogits must be [N, E >= k] for probs ", desc(in[1]), ", got ",
         desc(out[0]));
}
void checkAssign(const Attrs &a, const TTs &in, const TTs &out) {
  want(in[0], DType::F32, 2, "probs");
  wantChoices(in[1], in[0], "experts");
  wantChoices(out[0], in[0], "slots");
  want(out[1], DType::I32, 1, "counts");
  int64_t e = a.getInt("num_experts", 0);
  if (e < in[0].dim(1) || out[1].dim(0) != e)
    fail("num_experts ", e, " must be >= top-k ", in[0].dim(1),
         " and the length of counts ", desc(out[1]));
  if (a.has("capacity") && a.getInt("capacity", 0) < 1)
    fail("capacity must be >= 1, got ", a.getInt("capacity", 0));
}
/// tokens [N, H], slots [N, k], permuted [R, H].
void wantPermute(const TT &tokens, const TT &slots, const TT &permuted) {
  want(tokens, DType::F32, 2, "token rows");
  want(slots, DType::I32, 2, "slots");
  want(permuted, DType::F32, 2, "permuted rows");
  if (slots.dim(0) != tokens.dim(0) || permuted.dim(1) != tokens.dim(1))
    fail("slots ", desc(slots), ", token rows ", desc(tokens),
         " and permuted rows ", desc(permuted),
         " must agree on tokens and width");
}
void checkPermute(const Attrs &, const TTs &in, const TTs &out) {
  wantPermute(in[0], in[1], out[0]);
}
void checkPermuteGrad(const Attrs &, const TTs &in, const TTs &out) {
  wantPermute(out[0], in[1], in[0]);
}
void checkUnpermute(const Attrs &, const TTs &in, const TTs &out) {
  wantPermute(out[0], in[2], in[0]);
  want(in[1], DType::F32, 2, "probs");
  wantShape(in[1], in[2].shape, "probs");
}
void checkUnpermuteGrad(const Attrs &, const TTs &in, const TTs &out) {
  wantPermute(in[0], in[3], in[1]);
  want(in[2], DType::F32, 2, "probs");
  wantShape(in[2], in[3].shape, "probs");
  want(out[0], DType::F32, 2, "dy");
  wantShape(out[0], in[1].shape, "dy");
  want(out[1], DType::F32, 2, "dprobs");
  wantShape(out[1], in[3].shape, "dprobs");
}
void checkGrouped(const Attrs &a, const TTs &in, const TTs &out) {
  want(in[0], DType::F32, 2, "x");
  want(in[1], DType::F32, 3, "w");
  want(in[2], DType::I32, 1, "counts");
  bool tb = a.getInt("transpose_b", 0) != 0;
  int64_t e = in[1].dim(0), k = tb ? in[1].dim(2) : in[1].dim(1),
          n = tb ? in[1].dim(1) : in[1].dim(2);
  if (in[2].dim(0) != e)
    fail("counts ", desc(in[2]), " must have one entry per expert of w ",
         desc(in[1]));
  if (k != in[0].dim(1))
    fail("w ", desc(in[1]), " does not take rows of x ", desc(in[0]));
  want(out[0], DType::F32, 2, "y");
  wantShape(out[0], {in[0].dim(0), n}, "y");
}
void checkGroupedWgrad(const Attrs &, const TTs &in, const TTs &out) {
  want(in[0], DType::F32, 2, "x");
  want(in[1], DType::F32, 2, "dy");
  want(in[2], DType::I32, 1, "counts");
  if (in[0].dim(0) != in[1].dim(0))
    fail("x ", desc(in[0]), " and dy ", desc(in[1]), " must have the same rows");
  want(out[0], DType::F32, 3, "dw");
  wantShape(out[0], {in[2].dim(0), in[0].dim(1), in[1].dim(1)}, "dw");
}
void wantScalarF32(const TT &t, const char *what) {
  if (t.dtype != DType::F32 || t.numel() != 1)
    fail(what, " must be one f32, got ", desc(t));
}
void checkAux(const Attrs &a, const TTs &in, const TTs &out) {
  wantCoeff(a);
  bool grad = in.size() == 3;
  const TT &l = in[grad], &ex = in[grad + 1];
  want(l, DType::F32, 2, "logits");
  want(ex, DType::I32, 2, "experts");
  if (ex.dim(0) != l.dim(0) || ex.dim(1) > l.dim(1))
    fail("experts must be [N, k <= E] for logits ", desc(l), ", got ",
         desc(ex));
  if (grad) {
    wantScalarF32(in[0], "dloss");
    wantShape(out[0], l.shape, "dlogits");
    want(out[0], DType::F32, 2, "dlogits");
  } else {
    wantScalarF32(out[0], "loss");
  }
}
void checkZ(const Attrs &a, const TTs &in, const TTs &out) {
  wantCoeff(a);
  bool grad = in.size() == 2;
  const TT &l = in[grad];
  want(l, DType::F32, 2, "logits");
  if (grad) {
    wantScalarF32(in[0], "dloss");
    want(out[0], DType::F32, 2, "dlogits");
    wantShape(out[0], l.shape, "dlogits");
  } else {
    wantScalarF32(out[0], "loss");
  }
}

} // namespace mapp::rt::moe

//===- KernelSpecs.cpp - operand rules of docs/semantics.md ---------------===//
//
// Each check proves that the kernel cannot read or write outside its operands
// for the given shapes, so a plan that passes the loader cannot make a
// kernel crash. Messages name the operand and both shapes.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/KernelVocab.h"
#include "mapp/rt/ProbeReduce.h"
#include "AlgebraKernelChecks.h"
#include "MoeKernelChecks.h"

#include <algorithm>
#include <cmath>

using namespace mapp::rt;
using TT = TensorType;
using TTs = std::vector<TensorType>;

namespace {

std::string desc(const TT &t) {
  return std::string(dtypeName(t.dtype)) + shapeStr(t.shape);
}

void wantDType(const TT &t, DType d, const char *what) {
  if (t.dtype != d)
    fail(what, " must be ", dtypeName(d), ", got ", desc(t));
}
void wantF32(const TT &t, const char *what) { wantDType(t, DType::F32, what); }
void wantRankAtLeast(const TT &t, int r, const char *what) {
  if (t.rank() < r)
    fail(what, " must have rank >= ", r, ", got ", desc(t));
}
void wantSameNumel(const TT &a, const char *wa, const TT &b, const char *wb) {
  if (a.numel() != b.numel())
    fail(wa, " ", desc(a), " and ", wb, " ", desc(b),
         " must have the same element count");
}
void wantShape(const TT &t, const Shape &s, const char *what) {
  if (t.shape != s)
    fail(what, " must have shape ", shapeStr(s), ", got ", desc(t));
}
void wantScalar(const TT &t, const char *what) {
  if (t.numel() != 1)
    fail(what, " must hold one element, got ", desc(t));
}
int64_t normDim(int64_t d, int rank, const char *what) {
  if (d < 0)
    d += rank;
  if (d < 0 || d >= rank)
    fail(what, " ", d, " out of range for rank ", rank);
  return d;
}
Shape leading(const Shape &s, size_t drop) {
  return Shape(s.begin(), s.end() - std::min(drop, s.size()));
}

// Elementwise one-in-one-out kernels: same element count, f32.
void checkUnary(const Attrs &, const TTs &in, const TTs &out) {
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  wantSameNumel(in[0], "x", out[0], "y");
}
void checkUnaryGrad(const Attrs &, const TTs &in, const TTs &out) {
  wantF32(in[0], "dy");
  wantF32(in[1], "second operand");
  wantF32(out[0], "dx");
  wantSameNumel(in[0], "dy", in[1], "second operand");
  wantSameNumel(in[0], "dy", out[0], "dx");
}
void checkGelu(const Attrs &a, const TTs &in, const TTs &out) {
  std::string ap = a.getStr("approximate", "none");
  if (ap != "none" && ap != "tanh")
    fail("approximate must be \"none\" or \"tanh\", got \"", ap, "\"");
  if (in.size() == 1)
    checkUnary(a, in, out);
  else
    checkUnaryGrad(a, in, out);
}
void checkDropout(const Attrs &a, const TTs &in, const TTs &out) {
  double p = a.getFloat("p", 0);
  if (!(p >= 0 && p < 1))
    fail("dropout p must be in [0, 1), got ", p);
  a.getInt("seed", 0);
  checkUnary(a, in, out);
}
void checkScale(const Attrs &a, const TTs &in, const TTs &out) {
  a.requireFloat("factor");
  checkUnary(a, in, out);
}

void checkSoftcap(const Attrs &a, const TTs &in, const TTs &out) {
  if (!(a.requireFloat("cap") > 0))
    fail("cap must be > 0, got ", a.getFloat("cap", 0));
  if (in.size() == 1)
    checkUnary(a, in, out);
  else
    checkUnaryGrad(a, in, out);
}

void checkEmbedding(const Attrs &, const TTs &in, const TTs &out) {
  wantF32(in[0], "table");
  wantDType(in[1], DType::I32, "ids");
  if (in[0].rank() != 2)
    fail("table must be [V,H], got ", desc(in[0]));
  Shape s = in[1].shape;
  s.push_back(in[0].dim(1));
  wantF32(out[0], "y");
  wantShape(out[0], s, "y");
}
void checkEmbeddingGrad(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "dy");
  wantDType(in[1], DType::I32, "ids");
  wantF32(out[0], "dtable");
  if (out[0].rank() != 2)
    fail("dtable must be [V,H], got ", desc(out[0]));
  Shape s = in[1].shape;
  s.push_back(out[0].dim(1));
  wantShape(in[0], s, "dy");
  if (a.has("vocab") && a.getInt("vocab", 0) != out[0].dim(0))
    fail("vocab=", a.getInt("vocab", 0), " but dtable is ", desc(out[0]));
}
void checkLinear(const Attrs &, const TTs &in, const TTs &out) {
  for (const TT &t : in)
    wantF32(t, "linear operand");
  wantF32(out[0], "y");
  wantRankAtLeast(in[0], 1, "x");
  if (in[1].rank() != 2 || in[1].dim(1) != in[0].dim(-1))
    fail("w must be [N,K] with K = x's last dim; x is ", desc(in[0]), ", w is ",
         desc(in[1]));
  int64_t n = in[1].dim(0);
  if (in.size() == 3)
    wantShape(in[2], {n}, "b");
  Shape s = leading(in[0].shape, 1);
  s.push_back(n);
  wantShape(out[0], s, "y");
}
void checkMatmul(const Attrs &a, const TTs &in, const TTs &out) {
  for (const TT &t : in)
    wantF32(t, "matmul operand");
  wantF32(out[0], "c");
  wantRankAtLeast(in[0], 2, "a");
  wantRankAtLeast(in[1], 2, "b");
  bool ta = a.flag("transpose_a"), tb = a.flag("transpose_b");
  int64_t m = ta ? in[0].dim(-1) : in[0].dim(-2);
  int64_t k = ta ? in[0].dim(-2) : in[0].dim(-1);
  int64_t kb = tb ? in[1].dim(-1) : in[1].dim(-2);
  int64_t n = tb ? in[1].dim(-2) : in[1].dim(-1);
  if (k != kb)
    fail("inner dimensions differ: a is ", desc(in[0]), ", b is ", desc(in[1]),
         (ta ? " (transpose_a)" : ""), (tb ? " (transpose_b)" : ""));
  Shape batch = leading(in[0].shape, 2);
  if (in[1].rank() > 2 && leading(in[1].shape, 2) != batch)
    fail("batched b must have a's leading dims; a is ", desc(in[0]), ", b is ",
         desc(in[1]));
  Shape s = batch;
  s.push_back(m);
  s.push_back(n);
  wantShape(out[0], s, "c");
}
/// An fp8 meta (the last input): f32[3·(1+H)]; the operand formats and rows.
void checkFp8Meta(const Attrs &a, const TT &meta, bool gemm) {
  wantF32(meta, "fp8 meta");
  if (meta.rank() != 1 || meta.dim(0) < 6 || meta.dim(0) % 3 != 0)
    fail("fp8 meta must be f32[3 * (1 + history)], got ", desc(meta));
  if (!gemm)
    return;
  for (const char *k : {"fp8_a", "fp8_b"}) {
    std::string f = a.getStr(k, "");
    if (f != "e4m3" && f != "e5m2")
      fail(k, " must be \"e4m3\" or \"e5m2\", got \"", f, "\"");
  }
  if (a.getStr("fp8_a", "") == "e5m2" && a.getStr("fp8_b", "") == "e5m2")
    fail("an e5m2 x e5m2 product has no fp8 GEMM");
  for (const char *k : {"meta_a", "meta_b"}) {
    int64_t r = a.getInt(k, -1);
    if (r < 0 || r > 2)
      fail(k, " must be 0, 1 or 2, got ", r);
  }
}
void checkFp8Linear(const Attrs &a, const TTs &in, const TTs &out) {
  checkFp8Meta(a, in.back(), true);
  checkLinear(a, TTs(in.begin(), in.end() - 1), out);
}
void checkFp8Matmul(const Attrs &a, const TTs &in, const TTs &out) {
  checkFp8Meta(a, in.back(), true);
  if (a.flag("transpose_b") || in[1].rank() != 2 ||
      (a.flag("transpose_a") && in[0].rank() != 2))
    fail("fp8_matmul takes a 2-d b (no transpose_b) and, with transpose_a, a "
         "2-d a; a is ", desc(in[0]), ", b is ", desc(in[1]));
  checkMatmul(a, TTs(in.begin(), in.end() - 1), out);
}
void checkFp8Update(const Attrs &a, const TTs &in, const TTs &) {
  checkFp8Meta(a, in[0], false);
  int64_t h = a.getInt("history", 0);
  if (h < 1 || in[0].dim(0) != 3 * (1 + h))
    fail("fp8_update: history ", h, " does not match the meta ", desc(in[0]));
  if (a.getInt("margin", 0) < 0)
    fail("fp8_update: margin must be >= 0");
  for (const char *k : {"format_x", "format_w", "format_dy"})
    if (std::string x = a.getStr(k, ""); x != "e4m3" && x != "e5m2")
      fail("fp8_update: ", k, " must be \"e4m3\" or \"e5m2\", got \"", x, "\"");
}
void checkReduceSum(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  std::vector<int64_t> dims = a.getInts("dims");
  Shape s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= in[0].rank() || (i && dims[i] <= dims[i - 1]))
      fail("dims must be sorted, unique and within rank ", in[0].rank());
  }
  for (int d = 0; d < in[0].rank(); ++d)
    if (!std::count(dims.begin(), dims.end(), d))
      s.push_back(in[0].dim(d));
  wantShape(out[0], s, "y");
}
void checkBroadcast(const Attrs &, const TTs &in, const TTs &out) {
  wantF32(in[0], "a");
  wantF32(in[1], "b");
  wantF32(out[0], "y");
  const Shape &sa = in[0].shape, &sb = in[1].shape;
  if (sb.size() > sa.size() ||
      !std::equal(sb.begin(), sb.end(), sa.end() - sb.size()))
    fail("b's shape must be a suffix of a's; a is ", desc(in[0]), ", b is ",
         desc(in[1]));
  wantSameNumel(in[0], "a", out[0], "y");
}
void checkNorm(const Attrs &a, const TTs &in, const TTs &out) {
  double eps = a.getFloat("eps", 1e-5);
  if (!(eps >= 0))
    fail("eps must be >= 0, got ", eps);
  wantRankAtLeast(in[0], 1, "x");
  for (const TT &t : in)
    wantF32(t, "norm operand");
  int64_t h = in[0].dim(-1);
  for (size_t i = 1; i < in.size(); ++i)
    wantShape(in[i], {h}, i == 1 ? "gamma" : "beta");
  wantF32(out[0], "y");
  wantSameNumel(in[0], "x", out[0], "y");
}
void checkNormGrad(const Attrs &a, const TTs &in, const TTs &out) {
  a.getFloat("eps", 1e-5);
  for (const TT &t : in)
    wantF32(t, "norm grad operand");
  wantRankAtLeast(in[1], 1, "x");
  int64_t h = in[1].dim(-1);
  wantSameNumel(in[0], "dy", in[1], "x");
  wantShape(in[2], {h}, "gamma");
  wantSameNumel(out[0], "dx", in[1], "x");
  for (size_t i = 1; i < out.size(); ++i)
    wantShape(out[i], {h}, i == 1 ? "dgamma" : "dbeta");
  for (const TT &t : out)
    wantF32(t, "norm grad result");
}
void checkSoftmax(const Attrs &a, const TTs &in, const TTs &out) {
  wantRankAtLeast(in[0], 1, "x");
  if (in.size() == 1)
    checkUnary(a, in, out);
  else
    checkUnaryGrad(a, in, out);
}
void checkAttention(const Attrs &a, const TTs &in, const TTs &out) {
  int64_t heads = a.requireInt("heads");
  a.getFloat("scale", 1);
  a.getFloat("rotary_base", 10000);
  // q (and dout) [B,T,H]; k and v [B,T,Hk], Hk = key/value heads · D.
  const TT &q = in.size() == 4 ? in[1] : in[0];
  const TT &k = in.size() == 4 ? in[2] : in[1];
  for (const TT &t : in) {
    wantF32(t, "attention operand");
    if (t.rank() != 3)
      fail("attention operands must be [B,T,H], got ", desc(t));
  }
  int64_t h = q.dim(2);
  if (heads <= 0 || h % heads != 0)
    fail("heads=", heads, " must divide H=", h);
  int64_t d = h / heads, hk = k.dim(2);
  if (hk % d != 0 || hk == 0 || heads % (hk / d) != 0)
    fail("k and v must hold a divisor of heads=", heads, " key/value heads of ",
         d, " columns, got ", desc(k));
  for (size_t i = 0; i < in.size(); ++i) {
    bool kv = in.size() == 4 ? i >= 2 : i >= 1;
    wantShape(in[i], kv ? k.shape : q.shape, "attention operand");
  }
  if (a.flag("rotary") && d % 2 != 0)
    fail("rotary needs an even head dim, got ", d);
  if (a.has("rotary_dim")) {
    int64_t rd = a.getInt("rotary_dim", 0);
    if (!a.flag("rotary") || rd <= 0 || rd % 2 != 0 || rd > d)
      fail("rotary_dim must be even, in (0, head dim ", d, "] and with rotary, got ",
           rd);
  }
  if (a.has("softcap") && !(a.getFloat("softcap", 0) > 0))
    fail("softcap must be > 0, got ", a.getFloat("softcap", 0));
  if (a.has("sliding_window") &&
      (a.getInt("sliding_window", 0) <= 0 || !a.flag("causal")))
    fail("sliding_window must be > 0 and causal, got ",
         a.getInt("sliding_window", 0));
  for (size_t i = 0; i < out.size(); ++i) {
    wantF32(out[i], "attention result");
    wantShape(out[i], i == 0 ? q.shape : k.shape, "attention result");
  }
}
// q, k, v [B,S,H]; positions i32 [B,S]; key/value caches [B,Tmax,H],
// written in place; result [B,S,H].
void checkCachedAttention(const Attrs &a, const TTs &in, const TTs &out) {
  checkAttention(a, {in[0], in[1], in[2]}, out);
  wantDType(in[3], DType::I32, "positions");
  wantShape(in[3], leading(in[0].shape, 1), "positions");
  if (!a.flag("causal"))
    fail("cached_attention must be causal");
  for (int i : {4, 5}) {
    const char *what = i == 4 ? "key cache" : "value cache";
    wantF32(in[i], what);
    if (in[i].rank() != 3 || in[i].dim(0) != in[0].dim(0) ||
        in[i].dim(2) != in[1].dim(2) || in[i].dim(1) < in[0].dim(1))
      fail(what, " must be [B,Tmax,Hk] with Tmax >= S for k ", desc(in[1]),
           ", got ", desc(in[i]));
  }
}
void checkCrossEntropy(const Attrs &a, const TTs &in, const TTs &out) {
  a.getInt("ignore_index", -100);
  size_t li = in.size() == 3 ? 1 : 0; // logits index (grad has dloss first)
  if (li == 1) {
    wantF32(in[0], "dloss");
    wantScalar(in[0], "dloss");
  }
  const TT &logits = in[li], &targets = in[li + 1];
  wantF32(logits, "logits");
  wantDType(targets, DType::I32, "targets");
  wantRankAtLeast(logits, 1, "logits");
  if (leading(logits.shape, 1) != targets.shape)
    fail("targets must have logits' leading dims; logits is ", desc(logits),
         ", targets is ", desc(targets));
  wantF32(out[0], li ? "dlogits" : "loss");
  if (li)
    wantShape(out[0], logits.shape, "dlogits");
  else
    wantScalar(out[0], "loss");
}
void checkReshape(const Attrs &, const TTs &in, const TTs &out) {
  if (in[0].dtype != out[0].dtype)
    fail("reshape keeps the dtype: x is ", desc(in[0]), ", y is ",
         desc(out[0]));
  wantSameNumel(in[0], "x", out[0], "y");
}
void checkTranspose(const Attrs &a, const TTs &in, const TTs &out) {
  std::vector<int64_t> perm = a.getInts("perm");
  int r = in[0].rank();
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = static_cast<int>(sorted.size()) == r;
  for (int i = 0; ok && i < r; ++i)
    ok = sorted[i] == i;
  if (!ok)
    fail("perm must be a permutation of 0..", r - 1, " (x is ", desc(in[0]),
         ")");
  if (in[0].dtype != out[0].dtype)
    fail("transpose keeps the dtype");
  Shape s;
  for (int64_t p : perm)
    s.push_back(in[0].dim(static_cast<int>(p)));
  wantShape(out[0], s, "y");
}
void checkSlice(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  int64_t d = normDim(a.requireInt("dim"), in[0].rank(), "dim");
  int64_t start = a.requireInt("start"), end = a.requireInt("end");
  if (start < 0 || end < start || end > in[0].dim(static_cast<int>(d)))
    fail("slice [", start, ", ", end, ") out of range for dim ", d, " of ",
         desc(in[0]));
  Shape s = in[0].shape;
  s[d] = end - start;
  wantShape(out[0], s, "y");
}
void checkSliceGrad(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "dy");
  wantF32(out[0], "dx");
  if (in[0].rank() != out[0].rank())
    fail("dy ", desc(in[0]), " and dx ", desc(out[0]), " differ in rank");
  int64_t d = normDim(a.requireInt("dim"), in[0].rank(), "dim");
  int64_t start = a.requireInt("start");
  Shape s = out[0].shape;
  if (start < 0 || start + in[0].dim(static_cast<int>(d)) > s[d])
    fail("slice at ", start, " of dy ", desc(in[0]), " does not fit in dx ",
         desc(out[0]));
  s[d] = in[0].dim(static_cast<int>(d));
  wantShape(in[0], s, "dy");
}
void checkConcat(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(out[0], "y");
  int64_t d = normDim(a.requireInt("dim"), out[0].rank(), "dim");
  Shape s = in[0].shape;
  if (s.size() != out[0].shape.size())
    fail("inputs and result of concat differ in rank");
  s[d] = 0;
  for (const TT &t : in) {
    wantF32(t, "concat input");
    Shape u = t.shape;
    if (u.size() != s.size())
      fail("concat inputs differ in rank");
    s[d] += u[d];
    u[d] = s[d];
    if (u != s)
      fail("concat inputs differ outside dim ", d, ": ", desc(t));
  }
  wantShape(out[0], s, "y");
}
void checkFill(const Attrs &a, const TTs &, const TTs &out) {
  a.requireFloat("value");
  if (out[0].dtype != DType::F32 && out[0].dtype != DType::I32)
    fail("fill result must be f32 or i32, got ", desc(out[0]));
}
void checkGradAccumulate(const Attrs &, const TTs &in, const TTs &out) {
  wantF32(in[0], "g");
  wantF32(out[0], "grad buffer");
  wantSameNumel(in[0], "g", out[0], "grad buffer");
}
void checkGlobalNorm(const Attrs &, const TTs &in, const TTs &out) {
  for (const TT &t : in)
    wantF32(t, "global_norm input");
  wantF32(out[0], "n");
  wantScalar(out[0], "n");
}
void checkOptimizer(const Attrs &a, const TTs &in, size_t states) {
  a.requireFloat("lr");
  std::string sched = a.getStr("schedule", "constant");
  if (sched != "constant" && sched != "cosine")
    fail("schedule must be constant or cosine, got \"", sched, "\"");
  // Negative values made scheduledLr's total_steps - warmup overflow (found
  // by mapp-fuzz-plan under UBSan); the dialect verifier has the same rule.
  if (a.getInt("warmup", 0) < 0 || a.getInt("total_steps", 0) < 0)
    fail("warmup and total_steps must be >= 0");
  if (sched == "cosine" && a.getInt("total_steps", 0) <= a.getInt("warmup", 0))
    fail("cosine schedule needs total_steps > warmup");
  for (const TT &t : in)
    wantF32(t, "optimizer operand");
  for (size_t i = 1; i < 2 + states; ++i)
    wantSameNumel(in[0], "param", in[i], i == 1 ? "grad" : "state");
  if (in.size() > 2 + states)
    wantScalar(in.back(), "norm");
}
void checkAdamw(const Attrs &a, const TTs &in, const TTs &) {
  checkOptimizer(a, in, 2);
}
void checkSgd(const Attrs &a, const TTs &in, const TTs &) {
  if (a.flag("nesterov"))
    fail("sgd: nesterov is not supported (docs/semantics.md: nesterov=false)");
  checkOptimizer(a, in, 1);
}
// vocab_ce_partials: logits[...,V], targets[...] i32, rowmax[...] -> p[...,2];
// the grad: dp[...,2], logits, targets, rowmax -> dlogits.
void checkVocabCe(const Attrs &a, const TTs &in, const TTs &out) {
  a.getStr("group", "tp");
  size_t li = in.size() == 4 ? 1 : 0;
  const TT &logits = in[li], &targets = in[li + 1], &rowmax = in[li + 2];
  wantF32(logits, "logits");
  wantRankAtLeast(logits, 1, "logits");
  wantDType(targets, DType::I32, "targets");
  wantF32(rowmax, "rowmax");
  Shape lead = leading(logits.shape, 1);
  wantShape(targets, lead, "targets");
  wantShape(rowmax, lead, "rowmax");
  Shape p = lead;
  p.push_back(2);
  if (li) {
    wantF32(in[0], "dp");
    wantShape(in[0], p, "dp");
    wantF32(out[0], "dlogits");
    wantShape(out[0], logits.shape, "dlogits");
  } else {
    wantF32(out[0], "p");
    wantShape(out[0], p, "p");
  }
}
// ce_from_partials: P[...,2], targets -> loss[]; grad: dloss[], P, targets -> dP.
void checkCeFromPartials(const Attrs &a, const TTs &in, const TTs &out) {
  a.getInt("ignore_index", -100);
  size_t pi = in.size() == 3 ? 1 : 0;
  if (pi) {
    wantF32(in[0], "dloss");
    wantScalar(in[0], "dloss");
  }
  const TT &p = in[pi], &targets = in[pi + 1];
  wantF32(p, "P");
  wantRankAtLeast(p, 1, "P");
  if (p.dim(-1) != 2)
    fail("P must be [...,2], got ", desc(p));
  wantDType(targets, DType::I32, "targets");
  wantShape(targets, leading(p.shape, 1), "targets");
  wantF32(out[0], pi ? "dP" : "loss");
  if (pi)
    wantShape(out[0], p.shape, "dP");
  else
    wantScalar(out[0], "loss");
}
void checkReduceMax(const Attrs &a, const TTs &in, const TTs &out) {
  checkReduceSum(a, in, out);
}
void checkCopyToGroup(const Attrs &a, const TTs &in, const TTs &out) {
  a.getStr("group", "tp");
  checkUnary(a, in, out);
  wantShape(out[0], in[0].shape, "y");
}
void checkScatterToGroup(const Attrs &a, const TTs &in, const TTs &out) {
  a.getStr("group", "tp");
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  if (in[0].rank() != out[0].rank() || in[0].rank() == 0)
    fail("x ", desc(in[0]), " and y ", desc(out[0]), " must have one rank >= 1");
  int64_t d = normDim(a.getInt("dim", 0), in[0].rank(), "dim");
  Shape s = in[0].shape;
  if (out[0].dim(static_cast<int>(d)) <= 0 ||
      s[d] % out[0].dim(static_cast<int>(d)))
    fail("y ", desc(out[0]), " is not a slice of x ", desc(in[0]),
         " along dim ", d);
  s[d] = out[0].dim(static_cast<int>(d));
  wantShape(out[0], s, "y");
}
// grad_sync / param_gather: the bucket's buffers, updated in place (grad_sync
// lists them as inputs and outputs, param_gather as inputs only).
void checkBucket(const Attrs &a, const TTs &in, const TTs &out) {
  for (const TT &t : in)
    wantF32(t, "bucket buffer");
  if (!out.empty() && out.size() != in.size())
    fail("grad_sync outputs must be its inputs");
  for (size_t i = 0; i < out.size(); ++i)
    wantShape(out[i], in[i].shape, "grad_sync output");
  std::string mode = a.getStr("mode", "all_reduce");
  if (mode != "all_reduce" && mode != "reduce_scatter")
    fail("mode must be all_reduce or reduce_scatter, got \"", mode, "\"");
  if (!a.has("ranks"))
    a.getStr("group", "dp");
}
void checkCollective(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  a.getStr("group", "dp");
}
// ep_dispatch / ep_combine (backend/cpu/ExpertComm.cpp): [rows, ...] f32
// rows and a counts vector (one per global expert).
void checkExpertComm(const Attrs &a, const TTs &in, const TTs &out) {
  wantF32(in[0], "x");
  wantF32(out[0], "y");
  wantRankAtLeast(in[0], 1, "x");
  wantRankAtLeast(out[0], 1, "y");
  if (in[0].shape.size() != out[0].shape.size() ||
      !std::equal(in[0].shape.begin() + 1, in[0].shape.end(),
                  out[0].shape.begin() + 1))
    fail("x ", shapeStr(in[0].shape), " and y ", shapeStr(out[0].shape),
         " must be [rows, ...] alike past the row dimension");
  if (in[1].dtype != DType::F32 && in[1].dtype != DType::I32 &&
      in[1].dtype != DType::I64)
    fail("counts must be f32, i32 or i64, got ", dtypeName(in[1].dtype));
  if (in[1].shape.size() != 1 || in[1].shape[0] < 1)
    fail("counts must be a vector with one count per expert, got ",
         shapeStr(in[1].shape));
  if (out.size() > 1 && out[1].shape.size() != 1)
    fail("local_counts must be a vector, got ", shapeStr(out[1].shape));
  a.getStr("group", "ep");
}
// cp_shard / cp_unshard (backend/cpu/ContextParallel.cpp): alike but for
// `dim`, where the whole sequence is members times the share and splits
// into 2·members chunks.
void checkCpLayout(const Attrs &a, const TTs &in, const TTs &out) {
  int64_t members = a.requireInt("members");
  int64_t dim = a.requireInt("dim");
  a.getStr("group", "cp");
  if (members < 1)
    fail("members must be >= 1, got ", members);
  bool shard = in[0].shape.size() == out[0].shape.size() &&
               dim >= 0 && dim < (int64_t)in[0].shape.size() &&
               in[0].shape[dim] >= out[0].shape[dim];
  const TT &whole = shard ? in[0] : out[0], &share = shard ? out[0] : in[0];
  if (dim < 0 || dim >= (int64_t)whole.shape.size())
    fail("dim ", dim, " is outside ", desc(whole));
  if (whole.dtype != share.dtype)
    fail("operand and result must have one dtype, got ", desc(in[0]), " and ",
         desc(out[0]));
  if (whole.shape[dim] % (2 * members))
    fail("sequence length ", whole.shape[dim], " is not divisible by 2·cp = ",
         2 * members);
  Shape want = whole.shape;
  want[dim] /= members;
  wantShape(share, want, "cp share");
}
void checkCpAttention(const Attrs &a, const TTs &in, const TTs &out) {
  checkAttention(a, in, out);
  int64_t members = a.requireInt("members");
  std::string comm = a.getStr("comm", "ring");
  a.getStr("group", "cp");
  if (members < 1)
    fail("members must be >= 1, got ", members);
  if (comm != "ring" && comm != "a2a")
    fail("comm must be \"ring\" or \"a2a\", got \"", comm, "\"");
  const TT &q = in.size() == 4 ? in[1] : in[0];
  if (q.dim(1) % 2)
    fail("the sequence share ", q.dim(1), " must be two equal chunks");
}
void checkSendRecv(const Attrs &a, const TTs &, const TTs &) {
  a.requireInt("peer");
}
void checkTrace(const Attrs &a, const TTs &, const TTs &) {
  a.requireInt("id");
  a.getStr("name", "");
  a.getStr("category", "compute");
}

// MegaScope (src/probe): the checks live beside the kernels.
void checkProbe(const Attrs &a, const TTs &in, const TTs &) {
  checkProbeAttrs(a, in);
}
void checkPerturb(const Attrs &a, const TTs &in, const TTs &out) {
  checkPerturbAttrs(a, in);
  wantF32(out[0], "y");
  wantSameNumel(in[0], "x", out[0], "y");
}

/// Every kernel of KernelVocab.def, in its order.
const std::vector<KernelSpec> &specs() {
  static const std::vector<KernelSpec> all = {
#define MAPP_KERNEL(name, minIn, maxIn, minOut, maxOut, check, props, onCpu,    \
                    onCuda, why)                                                 \
  {#name, minIn, maxIn, minOut, maxOut, check, ((props) & kInPlace) != 0,      \
   props},
#include "mapp/rt/KernelVocab.def"
#undef MAPP_KERNEL
  };
  return all;
}

} // namespace

const KernelSpec *mapp::rt::findKernelSpec(const std::string &name) {
  for (const KernelSpec &s : specs())
    if (name == s.name)
      return &s;
  return nullptr;
}

const std::vector<KernelSpec> &mapp::rt::allKernelSpecs() { return specs(); }

bool mapp::rt::isExecutorKernel(const std::string &name) {
  const KernelInfo *k = findKernelInfo(name);
  return k && k->has(kExecutor);
}

void mapp::rt::checkKernelCall(const KernelSpec &spec, const Attrs &attrs,
                               const std::vector<TensorType> &in,
                               const std::vector<TensorType> &out) {
  int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  if (ni < spec.minIn || (spec.maxIn >= 0 && ni > spec.maxIn)) {
    if (spec.maxIn < 0)
      fail("takes at least ", spec.minIn, " inputs, got ", ni);
    if (spec.minIn == spec.maxIn)
      fail("takes ", spec.minIn, " inputs, got ", ni);
    fail("takes ", spec.minIn, " to ", spec.maxIn, " inputs, got ", ni);
  }
  if (no < spec.minOut || (spec.maxOut >= 0 && no > spec.maxOut))
    fail("produces ", spec.minOut, " outputs, got ", no);
  spec.check(attrs, in, out);
}

double mapp::rt::scheduledLr(const Attrs &a, int64_t k) {
  double lr = a.getFloat("lr", 0);
  if (a.getStr("schedule", "constant") != "cosine")
    return lr;
  int64_t warmup = a.getInt("warmup", 0), total = a.getInt("total_steps", 0);
  double minLr = a.getFloat("min_lr", 0);
  if (k < warmup)
    return lr * static_cast<double>(k + 1) / static_cast<double>(warmup);
  if (k >= total)
    return minLr;
  double t =
      static_cast<double>(k - warmup) / static_cast<double>(total - warmup);
  return minLr + 0.5 * (lr - minLr) * (1 + std::cos(M_PI * t));
}

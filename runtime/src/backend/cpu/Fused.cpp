//===- Fused.cpp - the fused-program evaluator (mapp.fused) ---------------===//
//
// One generic loop for every program --mapp-fuse forms (docs/fusion.md):
// the domain is walked in blocks of kBlock elements; each statement runs
// over the block into a small per-thread register file, so memory is read
// and written once (operands loaded, results stored) and no intermediate
// tensor exists. Statements round to float as the unfused kernels do
// (fused::apply), so the values are bit-identical to the unfused plan's.
// A final reduce_sum accumulates in double in element order, as
// reduce_sum's kernel does (serially, like it). A row program (a norm, a
// softmax) runs per row, rows in parallel: a pass over the row per
// reduction (the statements it needs, summed in double in element order,
// rounded once to float as reduce_sum, or maxed as reduce_max's kernel
// does), the row statements on scalars, then a pass for the rest, so its
// values are also the unfused plan's bits.
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/FusedProgram.h"

#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;
namespace fz = mapp::rt::fused;

namespace {

constexpr int64_t kBlock = 256;

float loadFloat(const Tensor &t, int64_t i) {
  switch (t.type.dtype) {
  case DType::BF16: return bf16ToFloat(static_cast<const uint16_t *>(t.data)[i]);
  case DType::F16: return f16ToFloat(static_cast<const uint16_t *>(t.data)[i]);
  default: return t.f32()[i];
  }
}

void storeFloat(const Tensor &t, int64_t i, float v) {
  switch (t.type.dtype) {
  case DType::BF16: static_cast<uint16_t *>(t.data)[i] = floatToBf16(v); break;
  case DType::F16: static_cast<uint16_t *>(t.data)[i] = floatToF16(v); break;
  default: t.f32()[i] = v; break;
  }
}

/// How an operand's elements map onto the domain (NumPy broadcasting): the
/// same (identity), a suffix of the domain's dims (index mod its size: a
/// bias), or general (strides, 0 along repeated dims).
struct Load {
  const Tensor *t;
  enum { Same, Suffix, Strided } kind;
  int64_t n;
  std::vector<int64_t> stride; // per domain dim, Strided only

  Load(const Tensor &x, const Shape &domain) : t(&x), n(x.numel()) {
    const Shape &s = x.shape();
    size_t lead = domain.size() - s.size();
    // Leading 1s of the operand do not change the mapping.
    size_t first = 0;
    while (first < s.size() && s[first] == 1)
      ++first;
    bool suffix = true;
    for (size_t d = first; d < s.size(); ++d)
      suffix = suffix && s[d] == domain[lead + d];
    kind = n == numel(domain) ? Same : suffix ? Suffix : Strided;
    if (kind != Strided)
      return;
    stride.assign(domain.size(), 0);
    int64_t st = 1;
    for (size_t d = s.size(); d-- > 0;) {
      stride[lead + d] = s[d] == 1 ? 0 : st;
      st *= s[d];
    }
  }

  float at(int64_t i, const Shape &domain) const {
    if (kind == Same)
      return loadFloat(*t, i);
    if (kind == Suffix)
      return loadFloat(*t, i % n);
    int64_t off = 0;
    for (size_t d = domain.size(); d-- > 0;) {
      off += (i % domain[d]) * stride[d];
      i /= domain[d];
    }
    return loadFloat(*t, off);
  }
};

/// o[j] = op(a[j], b[j], c[j]) for j < len: one switch per statement and
/// block, the loop specialized per op (fused::apply with a constant op).
void applyBlock(const fz::Stmt &st, const float *a, const float *b, const float *c, float *o,
                int64_t len) {
  switch (st.op) {
#define MAPP_FUSED_CASE(e, n, arity, i)                                        \
  case fz::Op::e:                                                              \
    for (int64_t j = 0; j < len; ++j)                                          \
      o[j] = fz::apply(fz::Op::e, a[j], arity > 1 ? b[j] : 0.f,                \
                       arity > 2 ? c[j] : 0.f, st.imm, st.tanh);               \
    break;
    MAPP_FUSED_OPS(MAPP_FUSED_CASE)
#undef MAPP_FUSED_CASE
  }
}

struct Evaluator {
  const fz::Program &prog;
  const Shape &domain;
  std::vector<Load> loads;
  int numStmts; // without a final reduce_sum

  /// Computes the statements before `upto` for elements [b, b + len):
  /// statement k's values at regs[k * kBlock], operand k's at ins[k] (f32
  /// operands of the domain's shape are read in place, others loaded into
  /// in). A row program's row values (and reduce_sums) are not computed
  /// here: their registers hold the row's value (rowStatements).
  void block(int64_t b, int64_t len, std::vector<float> &regs, std::vector<float> &in,
             std::vector<const float *> &ins, int upto) const {
    for (size_t k = 0; k < loads.size(); ++k) {
      const Load &l = loads[k];
      if (prog.rowDims && prog.rowInput[k])
        continue;
      if (l.kind == Load::Same && l.t->type.dtype == DType::F32) {
        ins[k] = l.t->f32() + b;
        continue;
      }
      for (int64_t j = 0; j < len; ++j)
        in[k * kBlock + j] = l.at(b + j, domain);
      ins[k] = in.data() + k * kBlock;
    }
    for (int s = 0; s < upto; ++s) {
      if (prog.rowDims && prog.rowValue(s))
        continue;
      const fz::Stmt &st = prog.stmts[s];
      const float *arg[3] = {nullptr, nullptr, nullptr};
      for (int a = 0; a < fz::info(st.op).arity; ++a)
        arg[a] = st.args[a].input ? ins[st.args[a].index]
                                  : regs.data() + st.args[a].index * kBlock;
      applyBlock(st, arg[0], arg[1], arg[2], regs.data() + s * kBlock, len);
    }
  }

  /// A row program's row statements in [from, to) for the row starting at
  /// element e, on scalars (rowVal), each also written across its register
  /// block, where statements per element read it broadcast.
  void rowStatements(int from, int to, int64_t e, std::vector<float> &rowVal,
                     std::vector<float> &regs) const {
    for (int s = from; s < to; ++s) {
      const fz::Stmt &st = prog.stmts[s];
      if (!st.row)
        continue;
      float x[3] = {0, 0, 0};
      for (int a = 0; a < fz::info(st.op).arity; ++a)
        x[a] = st.args[a].input ? loads[st.args[a].index].at(e, domain)
                                : rowVal[st.args[a].index];
      setRow(s, fz::apply(st.op, x[0], x[1], x[2], st.imm, st.tanh), rowVal, regs);
    }
  }

  static void setRow(int s, float v, std::vector<float> &rowVal, std::vector<float> &regs) {
    rowVal[s] = v;
    std::fill(regs.begin() + s * kBlock, regs.begin() + (s + 1) * kBlock, v);
  }
};

/// A row program (FusedProgram.h): rows in parallel; per row a pass per
/// reduction (the statements before it; the sum in double in element
/// order, as reduce_sum; the max as reduce_max, fz::maxStep), the row
/// statements after it, and a last pass for
/// the statements per element and the results.
void rowProgram(const KernelArgs &a, const Evaluator &ev, const std::vector<int64_t> &outputs) {
  const fz::Program &prog = ev.prog;
  int64_t inner = 1;
  for (size_t d = ev.domain.size() - prog.rowDims; d < ev.domain.size(); ++d)
    inner *= ev.domain[d];
  int64_t rows = 1;
  for (size_t d = 0; d + prog.rowDims < ev.domain.size(); ++d)
    rows *= ev.domain[d];
  int numStmts = static_cast<int>(prog.stmts.size());
  std::vector<int> reduces;
  for (int s = 0; s < numStmts; ++s)
    if (fz::isReduce(prog.stmts[s].op))
      reduces.push_back(s);
  bool perElementResults = false; // else no last pass (only row results)
  for (int k = 0; k < a.numOut; ++k)
    perElementResults = perElementResults || !prog.rowValue(outputs[k]);
  parFor(a, rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)),
         [&](int64_t rb, int64_t re) {
    std::vector<float> regs(numStmts * kBlock), in(std::max<size_t>(1, ev.loads.size()) * kBlock),
        rowVal(numStmts);
    std::vector<const float *> ins(ev.loads.size());
    for (int64_t o = rb; o < re; ++o) {
      int64_t e0 = o * inner;
      int done = 0; // statements before it are evaluated (row ones)
      for (int r : reduces) {
        ev.rowStatements(done, r, e0, rowVal, regs);
        const bool max = prog.stmts[r].op == fz::Op::ReduceMax;
        double sum = 0;
        float m = fz::negInf();
        const fz::Ref src = prog.stmts[r].args[0];
        for (int64_t b = e0; b < e0 + inner; b += kBlock) {
          int64_t len = std::min(kBlock, e0 + inner - b);
          ev.block(b, len, regs, in, ins, r);
          const float *v = src.input ? ins[src.index] : regs.data() + src.index * kBlock;
          if (max)
            for (int64_t j = 0; j < len; ++j)
              m = fz::maxStep(m, v[j]);
          else
            for (int64_t j = 0; j < len; ++j)
              sum += v[j];
        }
        Evaluator::setRow(r, max ? m : static_cast<float>(sum), rowVal, regs);
        done = r + 1;
      }
      ev.rowStatements(done, numStmts, e0, rowVal, regs);
      for (int64_t b = e0; perElementResults && b < e0 + inner; b += kBlock) {
        int64_t len = std::min(kBlock, e0 + inner - b);
        ev.block(b, len, regs, in, ins, numStmts);
        for (int k = 0; k < a.numOut; ++k)
          if (!prog.rowValue(outputs[k]))
            for (int64_t j = 0; j < len; ++j)
              storeFloat(a.out[k], b + j, regs[outputs[k] * kBlock + j]);
      }
      for (int k = 0; k < a.numOut; ++k)
        if (prog.rowValue(outputs[k]))
          storeFloat(a.out[k], o, rowVal[outputs[k]]);
    }
  });
}

} // namespace

void cpu::fused(const KernelArgs &a) {
  fz::Program prog;
  std::string err = fz::parse(a.attrs.getStr("program", ""), a.numIn, prog);
  if (!err.empty()) // checked at load; a hand-built call gets the reason
    throw Error("fused: program: " + err);
  Shape domain = a.attrs.getInts("domain");
  std::vector<int64_t> outputs = a.attrs.getInts("outputs");
  std::vector<Shape> inShapes, outShapes;
  for (int k = 0; k < a.numIn; ++k)
    inShapes.push_back(a.in[k].shape());
  for (int k = 0; k < a.numOut; ++k)
    outShapes.push_back(a.out[k].shape());
  if (static_cast<int>(outputs.size()) != a.numOut)
    err = "`outputs` names " + std::to_string(outputs.size()) + " statements for " +
          std::to_string(a.numOut) + " results";
  else
    err = fz::checkShapes(prog, domain, inShapes, outShapes, outputs);
  if (!err.empty())
    throw Error("fused: " + err);
  const fz::Stmt *reduce = prog.reduction();
  Evaluator ev{prog, domain, {}, static_cast<int>(prog.stmts.size()) - (reduce ? 1 : 0)};
  for (int k = 0; k < a.numIn; ++k)
    ev.loads.emplace_back(a.in[k], domain);
  if (prog.rowDims) {
    rowProgram(a, ev, outputs);
    return;
  }
  int64_t n = numel(domain);
  auto storeOutputs = [&](int64_t b, int64_t len, const std::vector<float> &regs) {
    for (int k = 0; k < a.numOut; ++k) {
      if (outputs[k] >= ev.numStmts)
        continue; // the reduction, stored below
      const float *v = regs.data() + outputs[k] * kBlock;
      for (int64_t j = 0; j < len; ++j)
        storeFloat(a.out[k], b + j, v[j]);
    }
  };
  size_t regSize = static_cast<size_t>(std::max(1, ev.numStmts)) * kBlock;
  size_t inSize = static_cast<size_t>(std::max<size_t>(1, ev.loads.size())) * kBlock;
  if (!reduce) {
    parFor(a, (n + kBlock - 1) / kBlock, 16, [&](int64_t bb, int64_t be) {
      std::vector<float> regs(regSize), in(inSize);
      std::vector<const float *> ins(ev.loads.size());
      for (int64_t blk = bb; blk < be; ++blk) {
        int64_t b = blk * kBlock, len = std::min(kBlock, n - b);
        ev.block(b, len, regs, in, ins, ev.numStmts);
        storeOutputs(b, len, regs);
      }
    });
    return;
  }
  // The reduction: reduce_sum's order (elements in order, double sums).
  int r = static_cast<int>(domain.size());
  std::vector<bool> reduced(r, false);
  for (int64_t d : reduce->dims)
    reduced[d] = true;
  std::vector<int64_t> ostride(r, 0);
  int64_t acc = 1;
  for (int i = r - 1; i >= 0; --i)
    if (!reduced[i]) {
      ostride[i] = acc;
      acc *= domain[i];
    }
  std::vector<double> sum(acc, 0.0);
  std::vector<int64_t> idx(r, 0);
  int64_t dst = 0;
  std::vector<float> regs(regSize), in(inSize);
  std::vector<const float *> ins(ev.loads.size());
  const fz::Ref src = reduce->args[0];
  for (int64_t b = 0; b < n; b += kBlock) {
    int64_t len = std::min(kBlock, n - b);
    ev.block(b, len, regs, in, ins, ev.numStmts);
    storeOutputs(b, len, regs);
    const float *v = src.input ? ins[src.index] : regs.data() + src.index * kBlock;
    for (int64_t j = 0; j < len; ++j) {
      sum[dst] += v[j];
      for (int k = r - 1; k >= 0; --k) {
        dst += ostride[k];
        if (++idx[k] < domain[k])
          break;
        dst -= ostride[k] * domain[k];
        idx[k] = 0;
      }
    }
  }
  int last = static_cast<int>(prog.stmts.size()) - 1;
  for (int k = 0; k < a.numOut; ++k)
    if (outputs[k] == last)
      for (size_t i = 0; i < sum.size(); ++i)
        storeFloat(a.out[k], static_cast<int64_t>(i), static_cast<float>(sum[i]));
}

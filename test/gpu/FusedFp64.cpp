//===- FusedFp64.cpp - a mapp.fused program in double ---------------------===//
//
// The GPU check's reference for generated fused kernels: every statement in
// double (no rounding between statements, unlike the kernels' fused::apply,
// and written apart from it: the formulas of docs/semantics.md), operands
// loaded with NumPy broadcasting, a trailing reduce_sum summed in double;
// a row program row by row, statement by statement over the row (a
// reduce_max: the largest non-NaN element, -inf if none, as the unfused
// reduce_max kernel).
//
//===----------------------------------------------------------------------===//
#include "Fp64Reference.h"
#include "mapp/rt/FusedProgram.h"

#include <algorithm>
#include <cmath>

using namespace mapp::rt;
using namespace mapp::test;
namespace fz = mapp::rt::fused;

namespace {

double op64(const fz::Stmt &st, double a, double b, double c) {
  const double k = std::sqrt(2.0 / M_PI), kappa = 0.044715;
  switch (st.op) {
  case fz::Op::Neg: return -a;
  case fz::Op::Abs: return std::fabs(a);
  case fz::Op::Sign: return a > 0 ? 1 : a < 0 ? -1 : 0;
  case fz::Op::Exp: return std::exp(a);
  case fz::Op::Log: return std::log(a);
  case fz::Op::Sqrt: return std::sqrt(a);
  case fz::Op::Rsqrt: return 1 / std::sqrt(a);
  case fz::Op::Tanh: return std::tanh(a);
  case fz::Op::Sin: return std::sin(a);
  case fz::Op::Cos: return std::cos(a);
  case fz::Op::Sigmoid: return 1 / (1 + std::exp(-a));
  case fz::Op::Silu: return a / (1 + std::exp(-a));
  case fz::Op::Pow: return std::pow(a, st.imm);
  case fz::Op::Scale: return a * st.imm;
  case fz::Op::Softcap: return st.imm * std::tanh(a / st.imm);
  case fz::Op::Gelu: return st.tanh ? geluTanh(a) : 0.5 * a * (1 + std::erf(a / std::sqrt(2.0)));
  case fz::Op::Add: return a + b;
  case fz::Op::Mul: return a * b;
  case fz::Op::Sub: return a - b;
  case fz::Op::Div: return a / b;
  case fz::Op::Maximum: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
  case fz::Op::Minimum: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
  case fz::Op::Lt: return a < b;
  case fz::Op::Le: return a <= b;
  case fz::Op::Gt: return a > b;
  case fz::Op::Ge: return a >= b;
  case fz::Op::Eq: return a == b;
  case fz::Op::Ne: return a != b;
  case fz::Op::SiluGrad: {
    double s = 1 / (1 + std::exp(-b));
    return a * s * (1 + b * (1 - s));
  }
  case fz::Op::GeluGrad: {
    if (st.tanh) {
      double t = std::tanh(k * (b + kappa * b * b * b));
      return a * (0.5 * (1 + t) + 0.5 * b * (1 - t * t) * k * (1 + 3 * kappa * b * b));
    }
    return a * (0.5 * (1 + std::erf(b / std::sqrt(2.0))) +
                b * std::exp(-0.5 * b * b) / std::sqrt(2 * M_PI));
  }
  case fz::Op::SoftcapGrad: {
    double t = std::tanh(b / st.imm);
    return a * (1 - t * t);
  }
  case fz::Op::Select: return a != 0 ? b : c;
  case fz::Op::ReduceSum: return a;
  case fz::Op::ReduceMax: return a;
  }
  return a;
}

} // namespace

bool mapp::test::fusedFp64(const Attrs &attrs, const std::vector<TensorType> &inTypes,
                           const std::vector<const float *> &in,
                           std::vector<Doubles> &out) {
  fz::Program prog;
  if (!fz::parse(attrs.getStr("program", ""), static_cast<int>(in.size()), prog).empty())
    return false;
  Shape domain = attrs.getInts("domain");
  std::vector<int64_t> outputs = attrs.getInts("outputs");
  const fz::Stmt *reduce = prog.reduction();
  int numStmts = static_cast<int>(prog.stmts.size()) - (reduce ? 1 : 0);
  int rank = static_cast<int>(domain.size());
  int64_t n = numel(domain);
  // Per operand, its element stride along each domain dim (0: broadcast).
  std::vector<std::vector<int64_t>> stride(in.size(), std::vector<int64_t>(rank, 0));
  for (size_t k = 0; k < in.size(); ++k) {
    const Shape &s = inTypes[k].shape;
    int64_t st = 1;
    for (size_t d = s.size(); d-- > 0;) {
      stride[k][rank - s.size() + d] = s[d] == 1 ? 0 : st;
      st *= s[d];
    }
  }
  if (prog.rowDims) { // a row program: row by row, each statement over the row
    int64_t inner = 1;
    for (int d = rank - prog.rowDims; d < rank; ++d)
      inner *= domain[d];
    int64_t rows = inner ? n / inner : 0;
    for (size_t k = 0; k < outputs.size(); ++k)
      out[k].assign(prog.rowValue(outputs[k]) ? rows : n, 0.0);
    auto inputAt = [&](size_t k, int64_t i) {
      int64_t off = 0;
      for (int d = rank - 1; d >= 0; --d) {
        off += (i % domain[d]) * stride[k][d];
        i /= domain[d];
      }
      return static_cast<double>(in[k][off]);
    };
    std::vector<std::vector<double>> v(prog.stmts.size());
    for (int64_t o = 0; o < rows; ++o) {
      int64_t e0 = o * inner;
      for (size_t s = 0; s < prog.stmts.size(); ++s) {
        const fz::Stmt &st = prog.stmts[s];
        bool row = prog.rowValue(s);
        v[s].assign(row ? 1 : inner, 0.0);
        auto arg = [&](const fz::Ref &r, int64_t j) {
          if (r.input)
            return inputAt(r.index, e0 + (prog.rowInput[r.index] ? 0 : j));
          return v[r.index][prog.rowValue(r.index) ? 0 : j];
        };
        if (st.op == fz::Op::ReduceSum)
          for (int64_t j = 0; j < inner; ++j)
            v[s][0] += arg(st.args[0], j);
        else if (st.op == fz::Op::ReduceMax) {
          v[s][0] = -INFINITY;
          for (int64_t j = 0; j < inner; ++j)
            if (double x = arg(st.args[0], j); !std::isnan(x))
              v[s][0] = std::max(v[s][0], x);
        } else
          for (int64_t j = 0; j < (row ? 1 : inner); ++j)
            v[s][j] = op64(st, arg(st.args[0], j), arg(st.args[1], j), arg(st.args[2], j));
      }
      for (size_t k = 0; k < outputs.size(); ++k) {
        const std::vector<double> &x = v[outputs[k]];
        if (prog.rowValue(outputs[k]))
          out[k][o] = x[0];
        else
          std::copy(x.begin(), x.end(), out[k].begin() + e0);
      }
    }
    return true;
  }
  // The reduction's result index of each domain element (kept dims, row-major).
  std::vector<bool> reduced(rank, false);
  if (reduce)
    for (int64_t d : reduce->dims)
      reduced[d] = true;
  int64_t kept = 1;
  for (int d = 0; d < rank; ++d)
    if (!reduced[d])
      kept *= domain[d];
  for (size_t k = 0; k < outputs.size(); ++k)
    out[k].assign(outputs[k] < numStmts ? n : kept, 0.0);
  std::vector<double> vals(prog.stmts.size()), ins(in.size());
  std::vector<int64_t> coord(rank);
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = i, keptIndex = 0, keptStride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      coord[d] = r % domain[d];
      r /= domain[d];
      if (!reduced[d]) {
        keptIndex += coord[d] * keptStride;
        keptStride *= domain[d];
      }
    }
    for (size_t k = 0; k < in.size(); ++k) {
      int64_t off = 0;
      for (int d = 0; d < rank; ++d)
        off += coord[d] * stride[k][d];
      ins[k] = in[k][off];
    }
    auto arg = [&](const fz::Ref &ref) { return ref.input ? ins[ref.index] : vals[ref.index]; };
    for (int s = 0; s < numStmts; ++s) {
      const fz::Stmt &st = prog.stmts[s];
      vals[s] = op64(st, arg(st.args[0]), arg(st.args[1]), arg(st.args[2]));
    }
    for (size_t k = 0; k < outputs.size(); ++k)
      if (outputs[k] < numStmts)
        out[k][i] = vals[outputs[k]];
      else
        out[k][keptIndex] += arg(reduce->args[0]);
  }
  return true;
}

//===- FusedProgram.h - the body of a mapp.fused op -------------*- C++ -*-===//
//
// The program a `mapp.fused` op / `fused` plan instruction carries
// (docs/fusion.md): statements over one iteration domain (the shape of the
// values it computes), each an elementwise op of the algebra applied to
// inputs (`%iK`, operand K, loaded with NumPy broadcasting to the domain)
// or earlier statements (`%N`); an optional last statement reduce_sum[dims]
// sums a statement over the listed domain dims. Text form, one statement
// per `;`:
//
//   silu(%i0); mul(%0, %i1); scale[0.5](%1); reduce_sum[0,1](%2)
//
// A row program (a norm, a softmax in one pass): reductions (reduce_sum,
// reduce_max) over the trailing dims (the rows) anywhere in the program;
// each gives one value per row; `row` statements compute once per row from
// row values and operands read per row; other statements read a row value
// broadcast along the row:
//
//   mul(%i0, %i0); reduce_sum[2](%0); row scale[0.0625](%1);
//   row add(%2, %i1); row rsqrt(%3); mul(%i0, %4); mul(%5, %i2)
//   reduce_max[1](%i0); sub(%i0, %0); exp(%1); reduce_sum[1](%2); div(%2, %3)
//
// reduce_max is a row reduction only (a program with one is a row
// program), with the unfused kernel's rule (maxStep: NaN skipped).
//
// Immediates in brackets: pow's exponent, scale's factor, softcap's cap (as
// %.17g, exact), gelu's approximation (`tanh`; none when absent), the
// reduced dims. Shared by the dialect's verifier, --mapp-fuse (which prints
// it), the plan loader's check and the backends' evaluators: plain C++, no
// MLIR. The scalar semantics (`apply`) are those of the unfused kernels
// (runtime/src/backend/cpu/Elementwise.cpp, Algebra.cpp): math in double
// rounded once to float, + − × ÷ in float, so a fused program computes
// bit-identical values on the CPU.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_FUSEDPROGRAM_H
#define MAPP_RT_FUSEDPROGRAM_H

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mapp/rt/FusedDevice.h"

namespace mapp::rt::fused {


struct OpInfo {
  Op op;
  const char *name;
  int arity;
  int immediate;
  const char *enumName; // Op's enumerator, for generated source
};

inline const std::vector<OpInfo> &opTable() {
  static const std::vector<OpInfo> table = {
#define MAPP_FUSED_INFO(e, n, a, i) {Op::e, n, a, i, #e},
      MAPP_FUSED_OPS(MAPP_FUSED_INFO)
#undef MAPP_FUSED_INFO
  };
  return table;
}

inline const OpInfo *findOp(const std::string &name) {
  for (const OpInfo &info : opTable())
    if (name == info.name)
      return &info;
  return nullptr;
}

inline const OpInfo &info(Op op) { return opTable()[static_cast<int>(op)]; }

/// An operand: input K of the op (loaded broadcast) or statement K's value.
struct Ref {
  bool input = false;
  int32_t index = 0;
};

struct Stmt {
  Op op = Op::Neg;
  bool row = false;          // `row op(...)`: once per row (a row program)
  Ref args[3];
  double imm = 0;            // pow / scale / softcap
  bool tanh = false;         // gelu, gelu_grad
  std::vector<int64_t> dims; // reduce_sum, reduce_max
};

struct Program {
  std::vector<Stmt> stmts;
  /// A row program: the number of trailing domain dims its reductions
  /// reduce (the rows' dims); 0 otherwise. Set by parse.
  int rowDims = 0;
  /// Per operand: read per element (false) or per row (true).
  std::vector<bool> rowInput;
  /// The reduction of a program that is not a row program when its last
  /// statement is reduce_sum, else null.
  const Stmt *reduction() const {
    return !rowDims && !stmts.empty() && stmts.back().op == Op::ReduceSum ? &stmts.back()
                                                                         : nullptr;
  }
  /// Statement k holds one value per row (a row statement or a reduction
  /// of a row program).
  bool rowValue(size_t k) const { return stmts[k].row || (rowDims && isReduce(stmts[k].op)); }
};

inline std::string formatDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

/// The text form (the inverse of parse).
inline std::string print(const Program &p) {
  std::string s;
  for (size_t k = 0; k < p.stmts.size(); ++k) {
    const Stmt &st = p.stmts[k];
    const OpInfo &oi = info(st.op);
    if (k)
      s += "; ";
    if (st.row)
      s += "row ";
    s += oi.name;
    if (oi.immediate == 1)
      s += "[" + formatDouble(st.imm) + "]";
    else if (oi.immediate == 2 && st.tanh)
      s += "[tanh]";
    else if (oi.immediate == 3) {
      s += "[";
      for (size_t d = 0; d < st.dims.size(); ++d)
        s += (d ? "," : "") + std::to_string(st.dims[d]);
      s += "]";
    }
    s += "(";
    for (int a = 0; a < oi.arity; ++a) {
      s += a ? ", %" : "%";
      if (st.args[a].input)
        s += "i";
      s += std::to_string(st.args[a].index);
    }
    s += ")";
  }
  return s;
}

/// The levels of a parsed program (part of parse): whether it is a row
/// program (a reduce_sum not last, several reductions, a reduce_max, or a
/// `row` statement), then its reductions reduce the same consecutive dims;
/// what each statement and operand is read at. "" or what is wrong.
inline std::string levels(Program &p, int numInputs) {
  p.rowDims = 0;
  p.rowInput.assign(numInputs, false);
  std::vector<int> readAt(numInputs, -1); // the first statement reading operand k
  const Stmt *firstReduce = nullptr;
  int reduces = 0;
  bool marked = false;
  for (const Stmt &st : p.stmts) {
    marked = marked || st.row || st.op == Op::ReduceMax;
    if (isReduce(st.op) && !reduces++)
      firstReduce = &st;
  }
  bool rows = marked || reduces > 1 ||
              (reduces == 1 && p.stmts.back().op != Op::ReduceSum);
  if (!rows)
    return "";
  auto at = [](size_t k) { return "statement " + std::to_string(k) + ": "; };
  auto dimsText = [](const std::vector<int64_t> &d) {
    std::string s;
    for (size_t i = 0; i < d.size(); ++i)
      s += (i ? "," : "") + std::to_string(d[i]);
    return "[" + s + "]";
  };
  if (!firstReduce)
    return "row statements need a reduce_sum or reduce_max over the rows (the trailing dims)";
  for (size_t d = 1; d < firstReduce->dims.size(); ++d)
    if (firstReduce->dims[d] != firstReduce->dims[d - 1] + 1)
      return std::string("a ") + info(firstReduce->op).name +
             " inside a program reduces the rows, consecutive trailing dims; got " +
             dimsText(firstReduce->dims);
  p.rowDims = static_cast<int>(firstReduce->dims.size());
  for (size_t k = 0; k < p.stmts.size(); ++k) {
    const Stmt &st = p.stmts[k];
    if (isReduce(st.op) && st.dims != firstReduce->dims)
      return at(k) + "the reductions of a row program reduce the same dims (the rows), got " +
             dimsText(firstReduce->dims) + " and " + dimsText(st.dims);
    for (int a = 0; a < info(st.op).arity; ++a) {
      const Ref &r = st.args[a];
      if (r.input) {
        int &first = readAt[r.index];
        if (first >= 0 && p.rowInput[r.index] != st.row)
          return at(k) + "operand %i" + std::to_string(r.index) + " is read " +
                 (st.row ? "per row here and per element by statement "
                         : "per element here and per row by statement ") +
                 std::to_string(first) + " (pass it as two operands)";
        if (first < 0)
          first = static_cast<int>(k);
        p.rowInput[r.index] = st.row;
        continue;
      }
      bool rowArg = p.rowValue(r.index);
      if (st.row && !rowArg)
        return at(k) + "a row statement reads %" + std::to_string(r.index) +
               ", a value per element (row statements read row values and operands)";
      if (isReduce(st.op) && rowArg)
        return at(k) + info(st.op).name + " reduces values per element; %" +
               std::to_string(r.index) + " is a row value";
    }
  }
  return "";
}

/// Parses `text` for an op of `numInputs` operands; "" on success, else what
/// is wrong (naming the statement). Checks references (inputs in range,
/// statements earlier), arity, immediates, and the levels (levels()).
inline std::string parse(const std::string &text, int numInputs, Program &out) {
  out.stmts.clear();
  size_t pos = 0, n = text.size();
  auto skipSpace = [&] {
    while (pos < n && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t'))
      ++pos;
  };
  auto err = [&](const std::string &what) {
    return "statement " + std::to_string(out.stmts.size()) + ": " + what + " (at offset " +
           std::to_string(pos) + " of '" + text + "')";
  };
  auto readInt = [&](int64_t &v) {
    char *end = nullptr;
    errno = 0;
    long long x = std::strtoll(text.c_str() + pos, &end, 10);
    if (end == text.c_str() + pos || errno)
      return false;
    pos = end - text.c_str();
    v = x;
    return true;
  };
  skipSpace();
  if (pos == n)
    return "the program is empty";
  while (pos < n) {
    skipSpace();
    auto word = [&] {
      size_t start = pos;
      while (pos < n && (std::isalnum(static_cast<unsigned char>(text[pos])) || text[pos] == '_'))
        ++pos;
      return text.substr(start, pos - start);
    };
    std::string name = word();
    Stmt st;
    if (name == "row" && pos < n && text[pos] == ' ') {
      st.row = true;
      skipSpace();
      name = word();
    }
    const OpInfo *oi = findOp(name);
    if (!oi)
      return err("unknown op '" + name + "'");
    if (st.row && isReduce(oi->op))
      return err(name + " reduces the domain's elements; it is not a row statement");
    st.op = oi->op;
    if (pos < n && text[pos] == '[') {
      ++pos;
      size_t close = text.find(']', pos);
      if (close == std::string::npos)
        return err("unclosed '['");
      std::string body = text.substr(pos, close - pos);
      if (oi->immediate == 1) {
        char *end = nullptr;
        st.imm = std::strtod(body.c_str(), &end);
        if (body.empty() || *end)
          return err("'" + body + "' is not a number");
      } else if (oi->immediate == 2) {
        if (body != "tanh")
          return err("gelu approximation must be tanh (none when absent), got '" + body + "'");
        st.tanh = true;
      } else if (oi->immediate == 3) {
        for (size_t p = 0; p < body.size();) {
          char *end = nullptr;
          long long d = std::strtoll(body.c_str() + p, &end, 10);
          if (end == body.c_str() + p || d < 0)
            return err(name + " dims must be non-negative integers, got '" + body + "'");
          if (!st.dims.empty() && d <= st.dims.back())
            return err(name + " dims must be increasing, got '" + body + "'");
          st.dims.push_back(d);
          p = end - body.c_str();
          if (p < body.size() && body[p] == ',')
            ++p;
        }
        if (st.dims.empty())
          return err(name + " needs at least one dim");
      } else {
        return err(name + " takes no immediate");
      }
      pos = close + 1;
    } else if (oi->immediate == 1 || oi->immediate == 3) {
      return err(name + " needs an immediate in [...]");
    }
    skipSpace();
    if (pos >= n || text[pos] != '(')
      return err("expected '(' after " + name);
    ++pos;
    for (int a = 0; a < oi->arity; ++a) {
      skipSpace();
      if (a) {
        if (pos >= n || text[pos] != ',')
          return err(name + " takes " + std::to_string(oi->arity) + " operands");
        ++pos;
        skipSpace();
      }
      if (pos >= n || text[pos] != '%')
        return err("expected an operand %iK or %N");
      ++pos;
      Ref &r = st.args[a];
      if (pos < n && text[pos] == 'i') {
        r.input = true;
        ++pos;
      }
      int64_t idx;
      if (!readInt(idx))
        return err("expected an operand number");
      if (r.input && (idx < 0 || idx >= numInputs))
        return err("input %i" + std::to_string(idx) + " out of range (the op has " +
                   std::to_string(numInputs) + " operands)");
      if (!r.input && (idx < 0 || idx >= static_cast<int64_t>(out.stmts.size())))
        return err("%" + std::to_string(idx) + " does not name an earlier statement");
      r.index = static_cast<int32_t>(idx);
    }
    skipSpace();
    if (pos >= n || text[pos] != ')')
      return err(name + " takes " + std::to_string(oi->arity) + " operands");
    ++pos;
    out.stmts.push_back(std::move(st));
    skipSpace();
    if (pos < n) {
      if (text[pos] != ';')
        return err("expected ';' between statements");
      ++pos;
    }
  }
  return levels(out, numInputs);
}

inline std::string shapeText(const std::vector<int64_t> &s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i)
    t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

/// The shape of statement k's values: the domain; without the reduced dims
/// for a reduction (the rows' shape for a row value).
inline std::vector<int64_t> valueShape(const Program &p, const std::vector<int64_t> &domain,
                                       size_t k) {
  std::vector<int64_t> s;
  if (p.rowDims && p.rowValue(k)) // the rows' shape
    return std::vector<int64_t>(
        domain.begin(), domain.end() - std::min<size_t>(p.rowDims, domain.size()));
  const Stmt *r = p.reduction();
  if (!r || k + 1 != p.stmts.size())
    return domain;
  for (size_t d = 0; d < domain.size(); ++d) {
    bool reduced = false;
    for (int64_t x : r->dims)
      reduced = reduced || x == static_cast<int64_t>(d);
    if (!reduced)
      s.push_back(domain[d]);
  }
  return s;
}

/// The shapes of a parsed program's operands and results against its
/// domain (the dialect's verifier and the plan loader): operands broadcast
/// to the domain (NumPy), operands read per row have extent 1 along the
/// rows, reduced dims in the domain (a row program's the trailing ones),
/// result k has statement outputs[k]'s shape (a row value: the rows' shape
/// or with the row dims kept as 1). "" or what is wrong.
inline std::string checkShapes(const Program &p, const std::vector<int64_t> &domain,
                               const std::vector<std::vector<int64_t>> &inputs,
                               const std::vector<std::vector<int64_t>> &results,
                               const std::vector<int64_t> &outputs) {
  const size_t rank = domain.size();
  // The generated kernels' argument block (FusedDevice.h) holds this many;
  // the CPU evaluator would run more, but a plan is for every backend.
  if (rank > static_cast<size_t>(kMaxRank) || inputs.size() > static_cast<size_t>(kMaxInputs) ||
      outputs.size() > static_cast<size_t>(kMaxOutputs))
    return "a domain of rank " + std::to_string(rank) + ", " + std::to_string(inputs.size()) +
           " operands and " + std::to_string(outputs.size()) +
           " outputs exceed a fused program's limits (rank " + std::to_string(kMaxRank) + ", " +
           std::to_string(kMaxInputs) + " operands, " + std::to_string(kMaxOutputs) + " outputs)";
  for (size_t k = 0; k < p.stmts.size(); ++k)
    for (int64_t d : p.stmts[k].dims) {
      if (d >= static_cast<int64_t>(rank))
        return std::string(info(p.stmts[k].op).name) + " dim " + std::to_string(d) +
               " is outside the domain " + shapeText(domain);
      if (p.rowDims && p.stmts[k].dims.back() != static_cast<int64_t>(rank) - 1)
        return "statement " + std::to_string(k) + ": a " + info(p.stmts[k].op).name +
               " inside a row program (a reduce_max, or a reduce_sum not the only, last "
               "statement) reduces the rows, the trailing dims of the domain " +
               shapeText(domain);
    }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<int64_t> &x = inputs[i];
    bool ok = x.size() <= rank, perRow = i < p.rowInput.size() && p.rowInput[i];
    for (size_t d = 0; ok && d < x.size(); ++d) {
      size_t at = rank - x.size() + d;
      ok = x[d] == 1 || (x[d] == domain[at] && !(perRow && at >= rank - p.rowDims));
    }
    if (!ok)
      return "operand " + std::to_string(i) + " of shape " + shapeText(x) +
             (perRow ? " is read per row and does not broadcast to the rows " : 
                       " does not broadcast to the domain ") +
             (perRow ? shapeText(std::vector<int64_t>(domain.begin(), domain.end() - p.rowDims)) +
                           " with the row dims kept as 1"
                     : shapeText(domain));
  }
  for (size_t k = 0; k < outputs.size() && k < results.size(); ++k) {
    if (outputs[k] < 0 || outputs[k] >= static_cast<int64_t>(p.stmts.size()))
      return "output " + std::to_string(k) + " names statement " + std::to_string(outputs[k]) +
             ", the program has " + std::to_string(p.stmts.size());
    std::vector<int64_t> want = valueShape(p, domain, outputs[k]), kept = want;
    bool row = p.rowDims && p.rowValue(outputs[k]);
    if (row)
      kept.resize(rank, 1);
    if (results[k] != want && !(row && results[k] == kept))
      return "result " + std::to_string(k) + " of shape " + shapeText(results[k]) +
             " must have shape " + shapeText(want) + (row ? " or " + shapeText(kept) : "") +
             " (statement " + std::to_string(outputs[k]) + ")";
  }
  return "";
}

} // namespace mapp::rt::fused

#endif

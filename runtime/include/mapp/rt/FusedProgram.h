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
  Ref args[3];
  double imm = 0;            // pow / scale / softcap
  bool tanh = false;         // gelu, gelu_grad
  std::vector<int64_t> dims; // reduce_sum
};

struct Program {
  std::vector<Stmt> stmts;
  /// The reduction when the last statement is reduce_sum, else null.
  const Stmt *reduction() const {
    return !stmts.empty() && stmts.back().op == Op::ReduceSum ? &stmts.back() : nullptr;
  }
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

/// Parses `text` for an op of `numInputs` operands; "" on success, else what
/// is wrong (naming the statement). Checks references (inputs in range,
/// statements earlier), arity, immediates, and that reduce_sum comes last.
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
    size_t start = pos;
    while (pos < n && (std::isalnum(static_cast<unsigned char>(text[pos])) || text[pos] == '_'))
      ++pos;
    std::string name = text.substr(start, pos - start);
    const OpInfo *oi = findOp(name);
    if (!oi)
      return err("unknown op '" + name + "'");
    if (!out.stmts.empty() && out.stmts.back().op == Op::ReduceSum)
      return err("reduce_sum must be the last statement");
    Stmt st;
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
            return err("reduce_sum dims must be non-negative integers, got '" + body + "'");
          if (!st.dims.empty() && d <= st.dims.back())
            return err("reduce_sum dims must be increasing, got '" + body + "'");
          st.dims.push_back(d);
          p = end - body.c_str();
          if (p < body.size() && body[p] == ',')
            ++p;
        }
        if (st.dims.empty())
          return err("reduce_sum needs at least one dim");
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
  return "";
}

} // namespace mapp::rt::fused

#endif

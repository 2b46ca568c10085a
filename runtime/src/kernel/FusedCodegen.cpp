//===- FusedCodegen.cpp - CUDA source for a mapp.fused program ------------===//
#include "mapp/rt/FusedCodegen.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace mapp::rt;
using namespace mapp::rt::fused;

const char *fused::deviceHeaderText() {
  return
#include "mapp/rt/FusedDeviceText.inc"
      ;
}

namespace {

/// A double literal that reads back exactly (hexadecimal).
std::string literal(double v) {
  if (std::isnan(v))
    return "(0.0 / 0.0)";
  if (std::isinf(v))
    return v > 0 ? "(1.0 / 0.0)" : "(-1.0 / 0.0)";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

std::string storageName(DType t, const std::string &what) {
  if (t == DType::F32)
    return "F32";
  if (t == DType::BF16)
    return "Bf16";
  fail("fused kernel generator: ", what, " is stored as ", dtypeName(t),
       "; generated kernels read and write f32 and bf16");
}

std::string ref(const Ref &r) { return (r.input ? "i" : "s") + std::to_string(r.index); }

/// The element's offset in a tensor of strides <table>: v when the
/// domain is flat, else Σ c[d]·<table>[d] over its `rank` dims; in a row
/// program (`rowAffine` non-empty: its offset at row o, element j, when
/// KernelParams::rowAffine) that before the coordinates.
std::string at(int rank, const std::string &table, const std::string &rowAffine = "") {
  if (rank == 0)
    return "0";
  std::string s = "a.flat ? v : ";
  if (!rowAffine.empty())
    s += "a.rowAffine ? " + rowAffine + " : ";
  for (int d = 0; d < rank; ++d)
    s += std::string(d ? " + " : "") + "c[" + std::to_string(d) + "] * " + table + "[" +
         std::to_string(d) + "]";
  return "(" + s + ")";
}

/// The element v's coordinates c[], the last dim fastest (not needed when
/// flat, nor in a row program (`row`) when rowAffine), computed once and
/// shared by every operand; 32-bit when n < 2^31.
std::string coordinates(int rank, bool row = false) {
  std::string s;
  if (rank > 0) {
    s += "    long long c[" + std::to_string(rank) + "] = {};\n    if (!a.flat" +
         std::string(row ? " && !a.rowAffine" : "") + ") {\n";
    for (int wide = 0; wide < 2; ++wide) {
      std::string T = wide ? "long long" : "unsigned";
      s += wide ? "      } else {\n" : "      if (a.idx32) {\n";
      s += "        " + T + " w = static_cast<" + T + ">(v);\n";
      for (int d = rank - 1; d >= 0; --d) {
        std::string c = "c[" + std::to_string(d) + "]";
        std::string dim = "static_cast<" + T + ">(a.dom[" + std::to_string(d) + "])";
        if (d == 0)
          s += "        " + c + " = w;\n";
        else
          s += "        " + c + " = w % " + dim + ";\n        w /= " + dim + ";\n";
      }
    }
    s += "      }\n    }\n";
  } else {
    s += "    (void)v;\n";
  }
  return s;
}

/// Statement k as a line of generated source: `const float sK = apply(...)`,
/// or for a row statement `r[K] = apply(...)`; a row value is read as r[K].
std::string statementLine(const Program &prog, int k) {
  const Stmt &st = prog.stmts[k];
  const OpInfo &oi = info(st.op);
  auto arg = [&](const Ref &r) {
    return !r.input && prog.rowDims && prog.rowValue(r.index)
               ? "r[" + std::to_string(r.index) + "]"
               : ref(r);
  };
  std::string args;
  for (int j = 0; j < 3; ++j)
    args += (j < oi.arity ? arg(st.args[j]) : std::string("0.f")) + ", ";
  std::string lhs = st.row ? "r[" + std::to_string(k) + "]" : "const float s" + std::to_string(k);
  return "    " + lhs + " = apply(Op::" + std::string(oi.enumName) + ", " + args +
         literal(st.imm) + ", " + (st.tanh ? "true" : "false") + "); // " + oi.name + "\n";
}


/// Sets a.vecMode[k] and a.vecPeriod[k] for operand k of a domain walked in
/// memory order (no reduction); false when the vector path cannot read it.
bool vectorMode(KernelParams &a, int k, int rank) {
  const long long *st = a.inStride[k];
  // Split s: the dims before it and from it; q = the elements from it.
  long long q = 1;
  for (int s = rank; s >= 0; --s) {
    if (s < rank)
      q *= a.dom[s];
    bool zeroAfter = true, sameAfter = true, zeroBefore = true, rowsBefore = true;
    for (int d = 0; d < rank; ++d) {
      if (a.dom[d] == 1)
        continue;
      if (d >= s) {
        zeroAfter = zeroAfter && st[d] == 0;
        sameAfter = sameAfter && st[d] == a.linStride[d];
      } else {
        zeroBefore = zeroBefore && st[d] == 0;
        rowsBefore = rowsBefore && st[d] * q == a.linStride[d];
      }
    }
    if (q <= 0)
      return false; // nothing to walk
    if (s == 0 && sameAfter) { // at the element's index
      a.vecMode[k] = 0;
      return true;
    }
    if (zeroAfter && rowsBefore && (q % 8 == 0 || q == a.n)) { // one value per row
      a.vecMode[k] = 2;
      a.vecPeriod[k] = q;
      return true;
    }
    if (sameAfter && zeroBefore && q % 8 == 0) { // a bias: v mod q
      a.vecMode[k] = 1;
      a.vecPeriod[k] = q;
      return true;
    }
  }
  return false;
}

/// Whether strides `st` over the walk dims [from, to) are `unit` times the
/// row-major strides of those dims (dims of extent 1 aside); `unit` is
/// found from the first dim that moves (0 when none does).
bool affineDims(const KernelParams &a, const long long *st, int from, int to, long long &unit) {
  unit = -1;
  long long q = 1;
  for (int p = to - 1; p >= from; --p) {
    if (a.dom[p] != 1) {
      if (unit < 0) {
        if (st[p] % q)
          return false;
        unit = st[p] / q;
      } else if (st[p] != unit * q) {
        return false;
      }
    }
    q *= a.dom[p];
  }
  unit = std::max(unit, 0LL);
  return true;
}

/// KernelParams::rowAffine of a row program whose rows are the walk dims
/// from `rowFrom`: every operand at o * rowStride + j * colStride, and the
/// results (linStride) at o * inner + j.
bool rowAffine(KernelParams &a, int rank, int rowFrom, size_t inputs) {
  long long rs = 0, cs = 0;
  if (!affineDims(a, a.linStride, 0, rowFrom, rs) || !affineDims(a, a.linStride, rowFrom, rank, cs) ||
      (a.outer > 1 && rs != a.inner) || (a.inner > 1 && cs != 1))
    return false;
  for (size_t k = 0; k < inputs; ++k)
    if (!affineDims(a, a.inStride[k], 0, rowFrom, a.rowStride[k]) ||
        !affineDims(a, a.inStride[k], rowFrom, rank, a.colStride[k]))
      return false;
  return true;
}

/// The struct P of a row program (FusedDevice.h, rowProgramLoop): per pass
/// the statements before its reduction (reduce_sum, reduce_max), the row
/// statements between the reductions, every statement per element with the
/// stores.
std::string rowProgramP(const CodegenSpec &spec, const std::vector<std::string> &inStorage,
                        const std::vector<std::string> &outStorage) {
  const Program &prog = spec.program;
  int rank = spec.rank, n = static_cast<int>(prog.stmts.size());
  std::vector<int> reduces;
  for (int k = 0; k < n; ++k)
    if (isReduce(prog.stmts[k].op))
      reduces.push_back(k);
  int phases = static_cast<int>(reduces.size());
  unsigned long long maxPhases = 0; // bit p: reduction p is a reduce_max
  if (phases > 64)
    fail("fused kernel generator: ", phases, " reductions in a row program (at most 64)");
  for (int p = 0; p < phases; ++p)
    if (prog.stmts[reduces[p]].op == Op::ReduceMax)
      maxPhases |= 1ull << p;
  // Row o's element j is the domain's element v = o * inner + j (the walk
  // order of a row program is the domain's); per-row values are read at
  // j = 0.
  auto loads = [&](bool perRow) {
    std::string t;
    for (size_t k = 0; k < spec.inputs.size(); ++k)
      if (prog.rowInput[k] == perRow) {
        std::string K = std::to_string(k);
        std::string affine = "o * a.rowStride[" + K + "]" +
                             (perRow ? "" : " + j * a.colStride[" + K + "]");
        t += "    const float i" + K + " = load" + inStorage[k] + "(a.in[" + K + "], " +
             at(rank, "a.inStride[" + K + "]", affine) + ");\n";
      }
    return t;
  };
  const std::string element =
      "    const long long v = o * a.inner + j;\n    (void)v;\n" + coordinates(rank, true);
  auto perElement = [&](int upto) {
    std::string t;
    for (int k = 0; k < upto; ++k)
      if (!prog.rowValue(k))
        t += statementLine(prog, k);
    return t;
  };
  std::string s = "  static constexpr int kPhases = " + std::to_string(phases) +
                  ";\n  static constexpr unsigned long long kMaxPhases = " +
                  std::to_string(maxPhases) + "ull;\n  static constexpr int kStmts = " +
                  std::to_string(n) + ";\n";
  // phase<Ph>: what reduction Ph reduces at element v.
  s += "  template <int Ph>\n  static MAPP_FUSED_HD float phase(const KernelParams &a, long long o, "
       "long long j, const float *r) {\n    (void)r;\n" + element + loads(false);
  for (int p = 0; p < phases; ++p) {
    const Ref &x = prog.stmts[reduces[p]].args[0];
    s += "    if constexpr (Ph == " + std::to_string(p) + ") {\n" + perElement(reduces[p]) +
         "    return " + ref(x) + ";\n    }\n";
  }
  s += "    return 0.f;\n  }\n";
  // rows<Q>: reduction Q-1's value, then the row statements before reduction Q.
  s += "  template <int Q>\n  static MAPP_FUSED_HD void rows(const KernelParams &a, long long o, "
       "float *r, float sum) {\n    (void)sum;\n    const long long j = 0;\n    (void)j;\n" +
       element + loads(true);
  for (int q = 0; q <= phases; ++q) {
    s += "    if constexpr (Q == " + std::to_string(q) + ") {\n";
    if (q > 0)
      s += "      r[" + std::to_string(reduces[q - 1]) + "] = sum;\n";
    for (int k = q ? reduces[q - 1] + 1 : 0; k < (q < phases ? reduces[q] : n); ++k)
      if (prog.stmts[k].row)
        s += statementLine(prog, k);
    s += "    }\n";
  }
  s += "  }\n";
  // point: every statement per element, the results of the domain's shape.
  s += "  static MAPP_FUSED_HD void point(const KernelParams &a, long long o, long long j, "
       "const float *r) {\n    (void)r;\n" + element + loads(false) + perElement(n);
  bool any = false;
  for (size_t k = 0; k < spec.outputs.size(); ++k)
    if (!prog.rowValue(spec.outputs[k])) {
      if (!any)
        s += "    const long long at = " + at(rank, "a.linStride", "v") + ";\n";
      any = true;
      s += "    store" + outStorage[k] + "(a.out[" + std::to_string(k) + "], at, s" +
           std::to_string(spec.outputs[k]) + ");\n";
    }
  s += "  }\n";
  s += "  static MAPP_FUSED_HD void storeRow(const KernelParams &a, long long o, const float *r) "
       "{\n    (void)a; (void)o; (void)r;\n";
  for (size_t k = 0; k < spec.outputs.size(); ++k)
    if (prog.rowValue(spec.outputs[k]))
      s += "    store" + outStorage[k] + "(a.out[" + std::to_string(k) + "], o, r[" +
           std::to_string(spec.outputs[k]) + "]);\n";
  s += "  }\n";
  return s;
}

} // namespace

int fused::vectorWidth(const CodegenSpec &spec) {
  for (const std::vector<DType> *v : {&spec.inputs, &spec.results})
    for (DType t : *v)
      if (t == DType::BF16)
        return 8;
  return 4;
}

std::string fused::generateKernel(const CodegenSpec &spec, const std::string &entry, bool host) {
  const Program &prog = spec.program;
  const Stmt *reduce = prog.reduction();
  int numStmts = static_cast<int>(prog.stmts.size()) - (reduce ? 1 : 0);
  int rank = spec.rank;
  if (rank < 0 || rank > kMaxRank)
    fail("fused kernel generator: a domain of rank ", rank, " (at most ", kMaxRank, ")");
  if (spec.inputs.size() > static_cast<size_t>(kMaxInputs))
    fail("fused kernel generator: ", spec.inputs.size(), " operands (at most ", kMaxInputs, ")");
  if (spec.results.size() > static_cast<size_t>(kMaxOutputs) ||
      spec.results.size() != spec.outputs.size())
    fail("fused kernel generator: ", spec.results.size(), " results for ", spec.outputs.size(),
         " outputs (at most ", kMaxOutputs, ")");
  std::vector<std::string> inStorage, outStorage;
  for (size_t k = 0; k < spec.inputs.size(); ++k)
    inStorage.push_back(storageName(spec.inputs[k], "operand " + std::to_string(k)));
  for (size_t k = 0; k < spec.outputs.size(); ++k) {
    int64_t stmt = spec.outputs[k];
    if (stmt < 0 || stmt >= static_cast<int64_t>(prog.stmts.size()))
      fail("fused kernel generator: result ", k, " holds statement ", stmt, " of ",
           prog.stmts.size());
    outStorage.push_back(storageName(spec.results[k], "result " + std::to_string(k)));
  }
  // The statements of one element, given i0.. (its operands): s0..
  std::string stmts;
  for (int k = 0; k < numStmts; ++k)
    stmts += statementLine(prog, k);
  int W = vectorWidth(spec);
  std::string ns = "mapp_fused_" + entry;
  std::string s = "// Generated by mapp (FusedCodegen.cpp) for the program\n//   " + print(prog) +
                  "\n// over a rank-" + std::to_string(rank) + " domain.\n";
  s += deviceHeaderText();
  s += "\nnamespace " + ns + " {\nusing namespace mapp::rt::fused;\nstruct P {\n";
  if (prog.rowDims) { // a row program: rowProgramLoop
    s += rowProgramP(spec, inStorage, outStorage) + "};\n} // namespace " + ns + "\n\n";
    if (host)
      return s + "extern \"C\" void " + entry +
             "(const mapp::rt::fused::KernelParams *a) {\n  mapp::rt::fused::hostRowLoop<" + ns +
             "::P>(*a);\n}\n";
    return s + "extern \"C\" __global__ void __launch_bounds__(256) " + entry +
           "(const mapp::rt::fused::KernelParams a) {\n  mapp::rt::fused::rowProgramLoop<" + ns +
           "::P>(a);\n}\n";
  }
  s += "  static MAPP_FUSED_HD float point(const KernelParams &a, long long v) {\n";
  s += coordinates(rank);
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    std::string K = std::to_string(k);
    s += "    const float i" + K + " = load" + inStorage[k] + "(a.in[" + K + "], " +
         at(rank, "a.inStride[" + K + "]") + ");\n";
  }
  s += stmts;
  bool anyDomainResult = false;
  for (size_t k = 0; k < spec.outputs.size(); ++k)
    if (spec.outputs[k] < numStmts) {
      if (!anyDomainResult)
        s += "    const long long at = " + at(rank, "a.linStride") + ";\n";
      anyDomainResult = true;
      s += "    store" + outStorage[k] + "(a.out[" + std::to_string(k) + "], at, s" +
           std::to_string(spec.outputs[k]) + ");\n";
    }
  s += "    return " + (reduce ? ref(reduce->args[0]) : std::string("0.f")) + ";\n  }\n";
  // The vector path (KernelParams::vec: flat, no reduction): W elements
  // from v, 16-byte loads and stores around the same statements.
  std::string WS = std::to_string(W);
  s += "  static MAPP_FUSED_HD void vec(const KernelParams &a, long long v) {\n";
  if (!reduce) {
    for (size_t k = 0; k < spec.inputs.size(); ++k) {
      std::string K = std::to_string(k);
      s += "    float x" + K + "[" + WS + "];\n    loadOperandVec<" + WS + ", " +
           (inStorage[k] == "Bf16" ? "true" : "false") + ">(a, " + K + ", v, x" + K + ");\n";
    }
    for (size_t k = 0; k < spec.outputs.size(); ++k)
      s += "    float r" + std::to_string(k) + "[" + WS + "];\n";
    s += "    MAPP_FUSED_UNROLL\n    for (int e = 0; e < " + WS + "; ++e) {\n";
    for (size_t k = 0; k < spec.inputs.size(); ++k)
      s += "      const float i" + std::to_string(k) + " = x" + std::to_string(k) + "[e];\n";
    for (size_t p = 0; p < stmts.size(); p = stmts.find('\n', p) + 1)
      s += "  " + stmts.substr(p, stmts.find('\n', p) + 1 - p); // indented in the loop
    for (size_t k = 0; k < spec.outputs.size(); ++k)
      s += "      r" + std::to_string(k) + "[e] = s" + std::to_string(spec.outputs[k]) + ";\n";
    s += "    }\n";
    for (size_t k = 0; k < spec.outputs.size(); ++k)
      s += "    storeVec" + outStorage[k] + "<" + WS + ">(a.out[" + std::to_string(k) +
           "], v, r" + std::to_string(k) + ");\n";
  }
  s += "    (void)a; (void)v;\n  }\n";
  s += "  static MAPP_FUSED_HD void storeReduced(const KernelParams &a, long long o, float r) {\n";
  for (size_t k = 0; k < spec.outputs.size(); ++k)
    if (spec.outputs[k] >= numStmts)
      s += "    store" + outStorage[k] + "(a.out[" + std::to_string(k) + "], o, r);\n";
  s += "    (void)a; (void)o; (void)r;\n  }\n};\n} // namespace " + ns + "\n\n";
  std::string loop = reduce ? "reduceLoop<" + ns + "::P>" : "elementwiseLoop<" + ns + "::P, " + WS + ">";
  if (host)
    s += "extern \"C\" void " + entry +
         "(const mapp::rt::fused::KernelParams *a) {\n  mapp::rt::fused::hostLoop<" + ns +
         "::P, " + WS + ">(*a, " + (reduce ? "true" : "false") + ");\n}\n";
  else
    s += "extern \"C\" __global__ void __launch_bounds__(256) " + entry +
         "(const mapp::rt::fused::KernelParams a) {\n  mapp::rt::fused::" + loop + "(a);\n}\n";
  return s;
}

KernelParams fused::kernelParams(const Program &program, const std::vector<int64_t> &domain,
                                 const std::vector<std::vector<int64_t>> &inputShapes,
                                 const std::vector<const void *> &inputs,
                                 const std::vector<void *> &results) {
  int rank = static_cast<int>(domain.size());
  if (rank > kMaxRank || inputs.size() > static_cast<size_t>(kMaxInputs) ||
      results.size() > static_cast<size_t>(kMaxOutputs))
    fail("fused: rank ", rank, ", ", inputs.size(), " operands, ", results.size(),
         " results exceed the generated kernels' limits (", kMaxRank, ", ", kMaxInputs, ", ",
         kMaxOutputs, ")");
  // The walk order: kept dims, then reduced dims (FusedDevice.h).
  std::vector<bool> reduced(rank, false);
  for (int d = rank - program.rowDims; program.rowDims && d < rank; ++d)
    reduced[std::max(d, 0)] = true; // the rows (a row program)
  if (const Stmt *r = program.reduction())
    for (int64_t d : r->dims) {
      if (d >= rank)
        fail("fused: reduce_sum dim ", d, " of a rank-", rank, " domain");
      reduced[d] = true;
    }
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < rank; ++d)
      if (reduced[d] == (pass == 1))
        order.push_back(d);
  KernelParams a{};
  a.n = 1;
  a.inner = 1;
  a.outer = 1; // results: a domain with a reduced extent 0 still has them (zeros)
  std::vector<int64_t> lin(rank, 1);
  for (int d = rank - 1; d >= 0; --d) {
    lin[d] = a.n;
    a.n *= domain[d];
    (reduced[d] ? a.inner : a.outer) *= domain[d];
  }
  for (int p = 0; p < rank; ++p) {
    a.dom[p] = domain[order[p]];
    a.linStride[p] = lin[order[p]];
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    const std::vector<int64_t> &s = inputShapes[k];
    if (s.size() > domain.size())
      fail("fused: operand ", k, " has rank ", s.size(), " above the domain's ", rank);
    size_t lead = domain.size() - s.size();
    std::vector<int64_t> stride(rank, 0);
    int64_t st = 1;
    for (size_t d = s.size(); d-- > 0;) {
      if (s[d] != 1 && s[d] != domain[lead + d])
        fail("fused: operand ", k, " dim ", d, " (", s[d], ") does not broadcast to the domain's ",
             domain[lead + d]);
      stride[lead + d] = s[d] == 1 ? 0 : st;
      st *= s[d];
    }
    for (int p = 0; p < rank; ++p)
      a.inStride[k][p] = stride[order[p]];
    a.in[k] = inputs[k];
  }
  for (size_t k = 0; k < results.size(); ++k)
    a.out[k] = results[k];
  bool flat = true;
  for (int p = 0; p < rank; ++p)
    flat = flat && order[p] == p;
  for (size_t k = 0; k < inputs.size(); ++k)
    for (int p = 0; p < rank; ++p)
      flat = flat && (a.dom[p] == 1 || a.inStride[k][p] == a.linStride[p]);
  a.flat = flat;
  // The vector path: 16-byte aligned pointers make every group of W (4 f32
  // or 8 bf16, vectorWidth) start on a 16-byte boundary; each operand is
  // read at the element's index, or broadcast as a suffix or a prefix of
  // the domain's dims with a period that is a multiple of 8 (FusedDevice.h).
  bool vec = !program.reduction() && !program.rowDims;
  for (const void *p : inputs)
    vec = vec && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  for (void *p : results)
    vec = vec && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  for (size_t k = 0; vec && k < inputs.size(); ++k)
    vec = vectorMode(a, static_cast<int>(k), rank);
  a.vec = vec;
  // Row o, element j: the walk's kept dims, then its reduced ones.
  int kept = static_cast<int>(std::count(reduced.begin(), reduced.end(), false));
  a.rowAffine = program.rowDims > 0 && rowAffine(a, rank, kept, inputs.size());
  a.idx32 = a.n < (1LL << 31);
  a.columns = program.reduction() && rank > 0 && !reduced[rank - 1];
  return a;
}

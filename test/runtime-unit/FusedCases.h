//===- FusedCases.h - mapp.fused programs to check generated kernels on ---===//
//
// The edge cases of the fused kernel generator (every op of
// MAPP_FUSED_OPS, broadcasts along every dim, reductions over leading,
// middle, trailing and several dims, leading-dim reductions at each of the
// column loop's block widths, sizes that leave a scalar tail after the
// 16-byte vectors, a scalar domain) and the case file
// test/python/test_fused_codegen.py and bench/gpu/fuse_gen.sh write (the
// programs of the fusion lit tests and the fused models): lines
// `program<TAB>domain<TAB>outputs<TAB>shape;shape...` (dims joined by x,
// `-` for a scalar). Shared by the host check (FusedCodegenCheck.cpp) and
// the GPU check (test/gpu/CudaKernelTest.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TEST_FUSED_CASES_H
#define MAPP_TEST_FUSED_CASES_H

#include "mapp/rt/FusedProgram.h"
#include "mapp/rt/Tensor.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mapp::fusedtest {

using mapp::rt::Shape;

struct Case {
  std::string program;
  Shape domain;
  std::vector<int64_t> outputs;
  std::vector<Shape> inputs;
};

inline std::vector<int64_t> splitInts(const std::string &s, char sep) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, sep))
    if (!part.empty() && part != "-")
      v.push_back(std::stoll(part));
  return v;
}

/// The shape of statement `k`'s values: the domain, or without the reduced dims.
inline Shape resultShape(const mapp::rt::fused::Program &p, const Shape &domain, int64_t k) {
  return mapp::rt::fused::valueShape(p, domain, static_cast<size_t>(k));
}

inline std::vector<Case> builtinCases() {
  std::vector<Case> cases;
  auto add = [&](std::string prog, Shape dom, std::vector<int64_t> outs, std::vector<Shape> ins) {
    cases.push_back({std::move(prog), std::move(dom), std::move(outs), std::move(ins)});
  };
  // Every op, each on inputs of the domain's shape (and a chain through it).
  for (const mapp::rt::fused::OpInfo &oi : mapp::rt::fused::opTable()) {
    if (mapp::rt::fused::isReduce(oi.op))
      continue;
    std::string imm = oi.immediate == 1 ? (oi.op == mapp::rt::fused::Op::Pow ? "[3]" : "[1.75]")
                      : oi.immediate == 2 ? "[tanh]" : "";
    std::string args = "(%i0";
    for (int a = 1; a < oi.arity; ++a)
      args += ", %i" + std::to_string(a);
    args += ")";
    std::vector<Shape> ins(oi.arity, Shape{3, 37});
    add(std::string(oi.name) + imm + args, {3, 37}, {0}, ins);
    if (oi.immediate == 2) // the erf form as well
      add(std::string(oi.name) + args, {3, 37}, {0}, ins);
  }
  add("pow[0.5](%i0); softcap[30](%0); scale[-0.125](%1)", {5, 7}, {2}, {{5, 7}});
  // Broadcasts along every dim of a rank-4 domain, and several at once.
  Shape d4{2, 3, 5, 7};
  for (int d = 0; d < 4; ++d) {
    Shape b = d4;
    b[d] = 1;
    add("mul(%i0, %i1); add(%0, %i0)", d4, {0, 1}, {d4, b});
  }
  add("select(%i0, %i1, %i2); sub(%0, %i3)", d4, {1}, {{2, 1, 5, 1}, {3, 1, 1}, {7}, {}});
  add("add(%i0, %i1)", d4, {0}, {{1, 3, 1, 7}, {2, 1, 5, 1}});
  // Reductions over leading, middle, trailing and several dims (with a
  // domain-shaped result stored beside the sum), and of an input.
  add("mul(%i0, %i0); reduce_sum[0](%0)", {300, 9}, {1}, {{300, 9}});
  add("mul(%i0, %i1); reduce_sum[1](%0)", {4, 600, 3}, {0, 1}, {{4, 600, 3}, {3}});
  add("exp(%i0); reduce_sum[2](%0)", {4, 3, 1000}, {0, 1}, {{4, 3, 1000}});
  add("silu(%i0); mul(%0, %i1); reduce_sum[0,2](%1)", {6, 5, 70}, {2}, {{6, 5, 70}, {6, 1, 70}});
  add("reduce_sum[0,1,2](%i0)", {3, 4, 5}, {0}, {{3, 4, 5}});
  add("neg(%i0); reduce_sum[0](%0)", {10}, {1}, {{10}});
  // Reductions over leading dims (the column loop): results not a multiple
  // of the block's 32, 16 and 8 (columnShape), two reduced dims with a
  // domain-shaped result, a single row.
  add("mul(%i0, %i1); reduce_sum[0](%0)", {3, 8500}, {1}, {{3, 8500}, {3, 1}});
  add("neg(%i0); reduce_sum[0](%0)", {5, 5000}, {1}, {{5, 5000}});
  add("mul(%i0, %i1); reduce_sum[0,1](%0)", {3, 70, 45}, {0, 1}, {{3, 70, 45}, {45}});
  add("exp(%i0); reduce_sum[0](%0)", {1, 13}, {1}, {{1, 13}});
  // The vector path: sizes not a multiple of 4 or 8 (the scalar tail), one
  // below a vector, two results.
  add("silu(%i0); mul(%0, %i1)", {5, 203}, {0, 1}, {{5, 203}, {5, 203}});
  add("sub(%i0, %i1)", {1027}, {0}, {{1027}, {1027}});
  add("sigmoid(%i0)", {3}, {0}, {{3}});
  // The vector path with broadcasts (periods multiples of 8): a bias (a
  // suffix), one value per row and a scalar (prefixes), a [T, C] table over
  // [B, T, C]; and a period of 12 (not a multiple of 8: the scalar path).
  add("add(%i0, %i1); gelu[tanh](%0)", {7, 40}, {1}, {{7, 40}, {40}});
  add("mul(%i0, %i1); mul(%0, %i2); add(%1, %i3)", {5, 48}, {2},
      {{5, 48}, {5, 1}, {48}, {}});
  add("sub(%i0, %i1)", {3, 5, 16}, {0}, {{3, 5, 16}, {5, 16}});
  add("add(%i0, %i1)", {5, 12}, {0}, {{5, 12}, {12}});
  add("add(%i0, %i1)", {}, {0}, {{}, {}}); // a scalar domain
  add("exp(%i0); reduce_sum[0](%0)", {0, 5}, {1}, {{0, 5}}); // nothing summed: zeros
  // Row programs (a reduce_sum inside the program: rowProgramLoop): an
  // RMS norm (the row factor a result too), a LayerNorm (two passes: the
  // mean, then the variance of x - mean), a row statement on operands only
  // (before the first reduce_sum), a softmax-like chain; rows of 8, 37,
  // 300 (several blocks of the CPU evaluator, more than the 256 threads),
  // two row dims, a single row. eps is squared: with random operands the
  // roots' arguments stay positive (no NaN, which compares equal).
  const std::string rms = "mul(%i0, %i0); reduce_sum[2](%0); row scale[0.03125](%1); "
                          "row mul(%i1, %i1); row add(%2, %3); row rsqrt(%4); mul(%i0, %5); "
                          "mul(%6, %i2)";
  for (int64_t c : {8, 37, 300})
    add(rms, {2, 3, c}, {7, 5}, {{2, 3, c}, {}, {c}});
  const std::string layer =
      "reduce_sum[1](%i0); row scale[0.01](%0); sub(%i0, %1); mul(%2, %2); reduce_sum[1](%3); "
      "row scale[0.01](%4); row mul(%i1, %i1); row add(%5, %6); row sqrt(%7); div(%2, %8); "
      "mul(%9, %i2); add(%10, %i3)";
  for (int64_t c : {8, 100, 257})
    add(layer, {5, c}, {11, 8}, {{5, c}, {5, 1}, {c}, {c}});
  add("row mul(%i2, %i2); mul(%i0, %i1); reduce_sum[1,2](%1); row mul(%2, %0); "
      "row scale[-0.5](%3); mul(%4, %i0); add(%5, %i1)",
      {3, 4, 6}, {6, 4}, {{3, 4, 6}, {3, 4, 6}, {3, 1, 1}});
  add("exp(%i0); reduce_sum[1](%0); row div(%i1, %1); mul(%0, %2)", {1, 33}, {3}, {{1, 33}, {}});
  // Operands broadcast in the middle of the kept dims (a weight per batch,
  // not per token) and of the rows' dims: not row-affine, read by their
  // coordinates (KernelParams::rowAffine off).
  add(rms, {2, 3, 40}, {7, 5}, {{2, 3, 40}, {}, {2, 1, 40}});
  add("row mul(%i2, %i2); mul(%i0, %i1); reduce_sum[1,2](%1); row mul(%2, %0); "
      "row scale[-0.5](%3); mul(%4, %i0); add(%5, %i1)",
      {3, 4, 6}, {6, 4}, {{3, 4, 6}, {3, 1, 6}, {3, 1, 1}});
  // Only row results (the CPU evaluator skips the last pass).
  add("mul(%i0, %i0); reduce_sum[1](%0); row sqrt(%1)", {4, 50}, {2, 1}, {{4, 50}});
  // Row programs with a reduce_max (a max pass: maxStep from -inf, a fixed
  // tree): a softmax (rows of 1, 37: not a multiple of 8 or 32), one over
  // large values (exp overflows without the shift) with -inf entries, a
  // row max skipping NaNs (log of negatives), two row dims, a cross-
  // entropy's log-sum-exp minus the target's logit, a max alone.
  const std::string softmax =
      "reduce_max[1](%i0); sub(%i0, %0); exp(%1); reduce_sum[1](%2); div(%2, %3)";
  add(softmax, {5, 37}, {4, 0}, {{5, 37}});
  add(softmax, {4, 1}, {4}, {{4, 1}});
  add("scale[40](%i0); sub(%i1, %i1); log(%1); gt(%i1, %i0); select(%3, %2, %0); "
      "reduce_max[1](%4); sub(%4, %5); exp(%6); reduce_sum[1](%7); div(%7, %8)",
      {6, 300}, {9, 5}, {{6, 300}, {300}});
  add("log(%i0); reduce_max[1](%0); sub(%0, %1)", {4, 1000}, {2, 1}, {{4, 1000}});
  add("reduce_max[1,2](%i0); sub(%i0, %0); exp(%1)", {3, 3, 7}, {2}, {{3, 3, 7}});
  add("reduce_max[1](%i0); sub(%i0, %0); exp(%1); reduce_sum[1](%2); row log(%3); "
      "row add(%4, %0); mul(%i0, %i1); reduce_sum[1](%6); row sub(%5, %7)",
      {8, 33}, {8}, {{8, 33}, {8, 33}});
  add("reduce_max[1](%i0)", {3, 9}, {0}, {{3, 9}});
  return cases;
}

/// Appends the cases of `path`; false with `err` naming the bad line.
inline bool readCases(const std::string &path, std::vector<Case> &cases, std::string &err) {
  std::ifstream f(path);
  if (!f) {
    err = "cannot read " + path;
    return false;
  }
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty())
      continue;
    std::vector<std::string> col;
    std::stringstream ss(line);
    std::string part;
    while (std::getline(ss, part, '\t'))
      col.push_back(part);
    if (col.size() != 4) {
      err = path + ": not 4 tab-separated columns: " + line;
      return false;
    }
    Case c{col[0], splitInts(col[1], ','), splitInts(col[2], ','), {}};
    std::stringstream shapes(col[3]);
    while (std::getline(shapes, part, ';'))
      c.inputs.push_back(splitInts(part, 'x'));
    cases.push_back(c);
  }
  return true;
}

} // namespace mapp::fusedtest

#endif

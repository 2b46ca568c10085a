//===- TestPlans.h - hand-built plans for tests -----------------*- C++ -*-===//
//
// Writes plan artifacts with the FlatBuffers builder, the way the compiler's
// Target/Plan writer will, so runtime tests do not wait for the compiler.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_TEST_PLANS_H
#define MAPP_RT_TEST_PLANS_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Plan.h"

#include <string>
#include <vector>

namespace mapp::rt::test {

struct TValue {
  std::string name;
  ValueKind kind;
  DType dtype;
  Shape shape;
  int param = -1;
  // Overrides for loader tests; by default build() computes them.
  int64_t offset = -1, bytes = -1;
};
struct TInstr {
  std::string kernel;
  std::vector<int> in, out;
  Attrs attrs;
};
struct TBlock {
  BlockKind kind;
  std::vector<TInstr> instrs;
};

/// A single-program plan; offsets are assigned by build() (arena for
/// Temp/Input/Loss, pool for the rest, 64-byte aligned, no reuse).
struct PlanSpec {
  int microBatchSize = 2, seqLength = 8, vocabSize = 16, numMicrobatches = 1;
  std::string optimizer = "sgd";
  double maxGradNorm = 0;
  int slots = 1;
  std::vector<TValue> values;
  std::vector<TBlock> blocks;
  std::vector<std::pair<int, int>> tasks; // (block, microbatch)
  int tokens = -1, targets = -1, loss = -1;
  uint32_t version = kPlanSchemaVersion;

  int add(TValue v) {
    values.push_back(std::move(v));
    return static_cast<int>(values.size()) - 1;
  }
  std::vector<uint8_t> build() const;
};

struct MlpOptions {
  int vocab = 16, hidden = 8, ffn = 12, batch = 2, seq = 8, microbatches = 1;
  std::string optimizer = "sgd"; // sgd | adamw
  double lr = 0.1;
  double maxGradNorm = 0;
  std::string schedule = "constant";
};

/// embedding -> linear+gelu -> linear -> cross_entropy, its hand-written
/// backward (cross_entropy_grad, matmul, reduce_sum, gelu_grad,
/// embedding_grad, grad_accumulate) and one optimizer instr per parameter.
/// Params: wte.weight [V,H], fc.weight [F,H], fc.bias [F], head.weight [V,F],
/// head.bias [V]. Gradients are scaled by 1/microbatches via dloss.
PlanSpec mlpPlan(const MlpOptions &o);

} // namespace mapp::rt::test

#endif

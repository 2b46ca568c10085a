//===- FusionPlanTest.cpp - which instruction pairs the CUDA backend fuses -===//
//
// planFusions is host code: these run without a GPU (no `gpu` label). Each
// case is a block shaped like the compiled GPT's, with the memory plan's
// byte ranges written out, so the conditions that make running work early
// or late invisible are checked both ways: the pair is found, and a
// placement that would make fusing wrong (a reused slot, a write in
// between, a second reader) keeps it apart. The fused results themselves
// are checked on the device (FusionCases.cpp).
//
//===----------------------------------------------------------------------===//
#include "Fusion.h"
#include "mapp/rt/Plan.h"

#include <gtest/gtest.h>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

struct Builder {
  Program p;
  /// A value at an explicit offset (so tests can make slots overlap).
  int value(ValueKind kind, Shape shape, uint64_t offset) {
    Value v;
    v.kind = kind;
    v.type = {DType::F32, std::move(shape)};
    v.bytes = v.type.numel() * 4;
    v.offset = offset;
    p.values.push_back(v);
    return static_cast<int>(p.values.size()) - 1;
  }
  Instr &instr(const char *kernel, std::vector<int> in, std::vector<int> out) {
    if (p.blocks.empty())
      p.blocks.emplace_back();
    Instr i;
    i.kernel = kernel;
    i.inputs = std::move(in);
    i.outputs = std::move(out);
    p.blocks[0].instrs.push_back(std::move(i));
    return p.blocks[0].instrs.back();
  }
  const Instr &at(size_t k) const { return p.blocks[0].instrs[k]; }
};

constexpr uint64_t kSlot = 1 << 20; // far apart: no accidental overlap

/// fc2's backward as compiled: the data gradient, the weight gradient
/// through view reshapes, the bias gradient, then gelu_grad of the data
/// gradient. `dpreOffset` places the gelu gradient; `writeDy` adds an
/// instruction that writes dy's bytes in between.
Builder fc2Backward(uint64_t dpreOffset, bool writeDy) {
  Builder b;
  int dy = b.value(ValueKind::Temp, {2, 4, 8}, 0);
  int w = b.value(ValueKind::Param, {8, 32}, 0);
  int pre = b.value(ValueKind::Temp, {2, 4, 32}, 1 * kSlot);
  int act = b.value(ValueKind::Temp, {2, 4, 32}, 2 * kSlot);
  int y = b.value(ValueKind::Temp, {2, 4, 32}, 3 * kSlot);
  int dy2 = b.value(ValueKind::Temp, {8, 8}, 0); // view of dy
  int act2 = b.value(ValueKind::Temp, {8, 32}, 2 * kSlot);
  int dw = b.value(ValueKind::Temp, {8, 32}, 4 * kSlot);
  int dpre = b.value(ValueKind::Temp, {2, 4, 32}, dpreOffset);
  b.instr("matmul", {dy, w}, {y});
  b.instr("gelu", {pre}, {act}).attrs.setStr("approximate", "tanh");
  b.instr("reshape", {act}, {act2}).attrs.setInt("alias", 1);
  b.instr("reshape", {dy}, {dy2}).attrs.setInt("alias", 1);
  b.instr("matmul", {dy2, act2}, {dw}).attrs.setInt("transpose_a", 1);
  if (writeDy) {
    int other = b.value(ValueKind::Temp, {2, 4, 8}, 0);
    b.instr("fill", {}, {other});
  }
  b.instr("gelu_grad", {y, pre}, {dpre}).attrs.setStr("approximate", "tanh");
  return b;
}

/// The switches with the opt-in DGELU on (MAPP_CUDA_FUSE=all).
FusionSwitches withDgelu() {
  FusionSwitches on;
  on.dgelu = true;
  return on;
}

TEST(FusionPlan, DgelusAcrossViewReshapes) {
  Builder b = fc2Backward(5 * kSlot, false);
  FusionTable t = planFusions(b.p, withDgelu());
  EXPECT_EQ(t.dgradGelu, 1);
  const Instr &gg = b.at(b.p.blocks[0].instrs.size() - 1);
  const FusedOp *f = t.find(gg.attrs);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->kind, FusedOp::DgradGelu);
  EXPECT_EQ(f->partner, &b.at(0));
  ASSERT_NE(t.find(b.at(0).attrs), nullptr);
  EXPECT_EQ(t.find(b.at(0).attrs)->kind, FusedOp::Skip);
}

TEST(FusionPlan, DgeluKeptApartWhenItsInputsChangeOrShareBytes) {
  // The gradient in dy's (dead) slot: the late GEMM would read what it writes.
  EXPECT_EQ(planFusions(fc2Backward(0, false).p, withDgelu()).dgradGelu, 0);
  // dy overwritten between the matmul and the gelu_grad.
  EXPECT_EQ(planFusions(fc2Backward(5 * kSlot, true).p, withDgelu()).dgradGelu, 0);
  // Off by default.
  EXPECT_EQ(planFusions(fc2Backward(5 * kSlot, false).p, FusionSwitches{}).dgradGelu, 0);
}

/// linear → add(residual, out), the sum at `sumOffset`.
Builder linearAdd(uint64_t sumOffset, bool secondReader) {
  Builder b;
  int x = b.value(ValueKind::Temp, {2, 4, 8}, 0);
  int w = b.value(ValueKind::Param, {8, 8}, 0);
  int bias = b.value(ValueKind::Param, {8}, kSlot);
  int r = b.value(ValueKind::Temp, {2, 4, 8}, 1 * kSlot);
  int y = b.value(ValueKind::Temp, {2, 4, 8}, 2 * kSlot);
  int sum = b.value(ValueKind::Temp, {2, 4, 8}, sumOffset);
  b.instr("linear", {x, w, bias}, {y});
  b.instr("add", {r, y}, {sum});
  if (secondReader) {
    int z = b.value(ValueKind::Temp, {2, 4, 8}, 4 * kSlot);
    b.instr("gelu", {y}, {z});
  }
  return b;
}

TEST(FusionPlan, LinearAddIntoTheResidualStream) {
  EXPECT_EQ(planFusions(linearAdd(3 * kSlot, false).p, FusionSwitches{}).linearAdd, 1);
  // In place on the residual: C = D, each element read before written.
  EXPECT_EQ(planFusions(linearAdd(1 * kSlot, false).p, FusionSwitches{}).linearAdd, 1);
  // The sum over the GEMM's input x: written while x is read.
  EXPECT_EQ(planFusions(linearAdd(0, false).p, FusionSwitches{}).linearAdd, 0);
  // The linear's output read by someone else too.
  EXPECT_EQ(planFusions(linearAdd(3 * kSlot, true).p, FusionSwitches{}).linearAdd, 0);
  FusionSwitches off;
  off.residual = false;
  EXPECT_EQ(planFusions(linearAdd(3 * kSlot, false).p, off).linearAdd, 0);
}

TEST(FusionPlan, NormGradAddKeepsItsOperandsIntact) {
  auto build = [](uint64_t sumOffset) {
    Builder b;
    int dy = b.value(ValueKind::Temp, {2, 4, 8}, 0);
    int x = b.value(ValueKind::Temp, {2, 4, 8}, 1 * kSlot);
    int g = b.value(ValueKind::Param, {8}, 0);
    int r = b.value(ValueKind::Temp, {2, 4, 8}, 2 * kSlot);
    int dx = b.value(ValueKind::Temp, {2, 4, 8}, 3 * kSlot);
    int dg = b.value(ValueKind::Temp, {8}, 4 * kSlot);
    int db = b.value(ValueKind::Temp, {8}, 5 * kSlot);
    int sum = b.value(ValueKind::Temp, {2, 4, 8}, sumOffset);
    b.instr("layer_norm_grad", {dy, x, g}, {dx, dg, db});
    b.instr("add", {dx, r}, {sum});
    return b;
  };
  EXPECT_EQ(planFusions(build(6 * kSlot).p, FusionSwitches{}).normGradAdd, 1);
  // The sum where dx would have gone: dx is never written, so that is fine.
  EXPECT_EQ(planFusions(build(3 * kSlot).p, FusionSwitches{}).normGradAdd, 1);
  // The sum over dy, which the column pass reads after the row pass wrote.
  EXPECT_EQ(planFusions(build(0).p, FusionSwitches{}).normGradAdd, 0);
}

} // namespace

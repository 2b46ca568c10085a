//===- ExpertTallyTest.cpp - tokens per expert of a step -------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ExpertTally.h"

#include <gtest/gtest.h>

using namespace mapp::rt;

namespace {
Tensor counts(std::vector<int32_t> &v) {
  return Tensor{v.data(), {DType::I32, {static_cast<int64_t>(v.size())}}};
}
} // namespace

TEST(ExpertTally, SumsMicrobatchesAndCountsARecomputeOnce) {
  auto be = createCpuBackend(1);
  ExpertTally tally;
  std::vector<int32_t> a{3, 1, 0, 4}, b{1, 1, 5, 1}, c{2, 2};
  tally.record("layers.1.mlp.moe_assign", 0, counts(c), *be);
  tally.record("layers.0.mlp.moe_assign", 0, counts(a), *be);
  tally.record("layers.0.mlp.moe_assign", 1, counts(b), *be);
  // The backward's recomputed forward routes microbatch 1 again.
  tally.record("layers.0.mlp.moe_assign.recompute", 1, counts(b), *be);
  ExpertTokens got = tally.take();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, "layers.1.mlp.moe_assign"); // first-seen order
  EXPECT_EQ(got[0].second, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(got[1].first, "layers.0.mlp.moe_assign");
  EXPECT_EQ(got[1].second, (std::vector<int64_t>{4, 2, 5, 5}));
  EXPECT_TRUE(tally.take().empty()); // reset for the next step
}

TEST(ExpertTally, CountsMustBeI32Vector) {
  auto be = createCpuBackend(1);
  ExpertTally tally;
  std::vector<float> f{1, 2};
  Tensor bad{f.data(), {DType::F32, {2}}};
  try {
    tally.record("layers.0.mlp.moe_assign", 0, bad, *be);
    FAIL() << "expected an error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("'layers.0.mlp.moe_assign': counts must be a "
                                         "1-d i32 tensor"),
              std::string::npos)
        << e.what();
  }
}

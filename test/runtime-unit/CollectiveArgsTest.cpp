//===- CollectiveArgsTest.cpp - the collective kernels' argument checks ---===//
//
// The one set of checks both backends' communication kernels run
// (backend/CollectiveArgs.h), each message once: the CPU and CUDA kernels
// call these functions and no copy of their own.

#include "backend/CollectiveArgs.h"

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <functional>

using namespace mapp::rt;

namespace {

/// The message of the Error `f` throws ("" when it throws none).
std::string errorOf(const std::function<void()> &f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

/// A kernel call on tensors of the given shapes (no data: checks only).
struct Call {
  Attrs attrs;
  Tensor x, y;
  KernelContext ctx;
  Call(Shape xs, Shape ys)
      : x{nullptr, TensorType{DType::F32, std::move(xs)}},
        y{nullptr, TensorType{DType::F32, std::move(ys)}} {}
  KernelArgs args() { return KernelArgs{attrs, &x, 1, &y, 1, ctx}; }
};

const CommGroup kOne{"tp", {0}}, kTwo{"tp", {0, 1}};

std::string collectiveError(Collective c, Shape xs, Shape ys,
                            const CommGroup &g,
                            std::function<void(Attrs &)> set = {}) {
  Call call(std::move(xs), std::move(ys));
  if (set)
    set(call.attrs);
  return errorOf([&] { checkCollective(c, call.args(), g); });
}

} // namespace

TEST(CollectiveArgs, ElementCountsOfAllReduceAndGroupsOfOne) {
  EXPECT_EQ(collectiveError(Collective::AllReduce, {4}, {3}, kTwo),
            "all_reduce: x and y differ in element count");
  EXPECT_EQ(collectiveError(Collective::AllGather, {4}, {8}, kOne),
            "all_gather: a single-rank group keeps the element count");
  EXPECT_EQ(collectiveError(Collective::ReduceScatter, {4}, {2}, kOne),
            "reduce_scatter: a single-rank group keeps the element count");
  EXPECT_EQ(collectiveError(Collective::AllToAll, {4}, {2}, kOne),
            "all_to_all: a single-rank group keeps the element count");
  // A group of one copies whatever shape keeps the count.
  Call call({2, 3}, {6});
  EXPECT_TRUE(
      checkCollective(Collective::AllToAll, call.args(), kOne).copyOnly);
}

TEST(CollectiveArgs, GatherAndScatterShapes) {
  Call call({2, 3}, {2, 6});
  call.attrs.setInt("dim", -1);
  CollectiveLayout l =
      checkCollective(Collective::AllGather, call.args(), kTwo);
  EXPECT_FALSE(l.copyOnly);
  EXPECT_EQ(l.dim, 1);
  EXPECT_EQ(collectiveError(Collective::AllGather, {2, 3}, {2, 6}, kTwo),
            "all_gather over tp [0,1]: y has shape [2,6], expected [4,3]");
  EXPECT_EQ(collectiveError(Collective::ReduceScatter, {3, 2}, {1, 2}, kTwo),
            "reduce_scatter: x shape [3,2] cannot be split over tp [0,1]");
  EXPECT_EQ(collectiveError(Collective::AllGather, {2, 3}, {4, 3}, kTwo,
                            [](Attrs &a) { a.setInt("dim", 2); }),
            "all_gather: dim 2 out of range for rank 2");
}

TEST(CollectiveArgs, AllToAllSplitAndConcat) {
  auto dims = [](Attrs &a) {
    a.setInt("split_dim", 0);
    a.setInt("concat_dim", 1);
  };
  Call call({4, 6}, {2, 12});
  dims(call.attrs);
  CollectiveLayout l = checkCollective(Collective::AllToAll, call.args(), kTwo);
  EXPECT_EQ(l.piece, (Shape{2, 6}));
  EXPECT_EQ(std::make_pair(l.splitDim, l.concatDim),
            std::make_pair(int64_t(0), int64_t(1)));
  EXPECT_EQ(collectiveError(Collective::AllToAll, {3, 6}, {3, 6}, kTwo, dims),
            "all_to_all: split_dim of [3,6] is not divisible by 2");
  EXPECT_EQ(collectiveError(Collective::AllToAll, {4, 6}, {4, 6}, kTwo, dims),
            "all_to_all over tp [0,1]: y has shape [4,6], expected [2,12]");
}

TEST(CollectiveArgs, CommunicatorGroupAndReduction) {
  Call call({4}, {4});
  EXPECT_EQ(errorOf([&] { communicatorOf(call.args(), "all_reduce"); }),
            "all_reduce: no communicator attached");
  call.attrs.setStr("reduction", "median");
  EXPECT_EQ(errorOf([&] { reductionOf(call.args(), "all_reduce", "sum"); }),
            "all_reduce: unknown reduction 'median'");
  std::unique_ptr<Communicator> world = createLocalComm();
  call.attrs.setInts("ranks", {1, 2});
  EXPECT_EQ(kernelGroupOf(call.args(), *world, "dp").members,
            (std::vector<int>{1, 2}));
}

TEST(CollectiveArgs, ContextParallelGroupAndSequence) {
  Call call({2, 8, 4}, {2, 4, 4});
  call.attrs.setInt("members", 2);
  EXPECT_EQ(errorOf([&] { cpMemberOf(call.args(), "cp_shard"); }),
            "cp_shard: members = 2 needs a communicator");
  std::unique_ptr<Communicator> world = createLocalComm(); // rank 0 of 1
  call.ctx.comm = world.get();
  EXPECT_EQ(errorOf([&] { cpMemberOf(call.args(), "cp_shard"); }),
            "cp_shard: the cp group cp [0] has 1 members, the op was "
            "compiled for 2 (the plan's cp does not match the pass's)");
  call.attrs.setInts("ranks", {1, 2});
  EXPECT_EQ(errorOf([&] { cpGroupOf(call.args(), *world, "cp_attention"); }),
            "cp_attention: rank 0 is not in its cp group ranks [1,2]");
  call.attrs = Attrs();
  EXPECT_EQ(cpMemberOf(call.args(), "cp_shard"),
            std::make_pair(int64_t(0), int64_t(1)));
  EXPECT_EQ(cpSequenceOf({2, 8, 4}, 1, 2, "cp_shard"), 8);
  EXPECT_EQ(errorOf([] { cpSequenceOf({2, 8, 4}, 3, 2, "cp_shard"); }),
            "cp_shard: dim 3 is outside [2,8,4]");
  EXPECT_EQ(errorOf([] { cpSequenceOf({2, 6, 4}, 1, 2, "cp_unshard"); }),
            "cp_unshard: sequence length 6 is not divisible by 2·cp = 4");
}

TEST(CollectiveArgs, ExpertRowsAndCapacity) {
  Tensor x{nullptr, TensorType{DType::F32, {6, 4}}},
      y{nullptr, TensorType{DType::F32, {9, 4}}},
      wide{nullptr, TensorType{DType::F32, {9, 5}}},
      flat{nullptr, TensorType{DType::F32, {9}}};
  EXPECT_EQ(expertRowElems(x, y, "ep_dispatch"), 4);
  EXPECT_EQ(errorOf([&] { expertRowElems(x, wide, "ep_dispatch"); }),
            "ep_dispatch: x [6,4] and y [9,5] differ past the row dimension");
  EXPECT_EQ(errorOf([&] { expertRowElems(x, flat, "ep_combine"); }),
            "ep_combine: x [6,4] and y [9] must be [rows, ...] of the same "
            "rank");
  EXPECT_EQ(errorOf([&] { checkExpertCapacity("ep_dispatch", kTwo, 1, 9, 9); }),
            "");
  EXPECT_EQ(errorOf([&] { checkExpertCapacity("ep_combine", kTwo, 1, 10, 9); }),
            "ep_combine over tp [0,1] (rank 1): 10 rows routed to this rank's "
            "experts, y holds 9 (capacity too small)");
}

//===- CalibrateExecTest.cpp - --calibrate's executor programs, rank threads -===//
//
// The add-chain program that op_overhead_us is measured on really runs
// every instruction (its values against the closed form), the measurement's
// two sizes are ordered, and runOnRankThreads (mapp-run's and --calibrate's
// rank threads) names the rank that failed first and frees the ranks
// waiting on it.
//
//===----------------------------------------------------------------------===//
#include "run/CalibrateExec.h"
#include "run/RankThreads.h"

#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Faults.h"

#include <gtest/gtest.h>

using namespace mapp::rt;

namespace {

std::unique_ptr<Backend> cpu() { return createBackend("cpu", 1, 0); }

} // namespace

TEST(CalibrateExec, AddChainRunsEveryInstruction) {
  // x0 = 1, x1 = x2 = 0; op i writes x1 (i even) or x2 (i odd) = the other
  // + x0: after `ops` adds the last written holds ops, the other ops - 1.
  for (int ops : {5, 6}) {
    Plan plan = addChainPlan(ops, 16);
    auto be = cpu();
    auto comm = createLocalComm();
    Executor ex(plan, *be, *comm);
    std::vector<float> ones(16, 1.0f), zeros(16, 0.0f);
    ex.writeFloats(0, 0, 0, ones.data(), 16);
    ex.writeFloats(1, 0, 0, zeros.data(), 16);
    ex.writeFloats(2, 0, 0, zeros.data(), 16);
    ex.step({});
    int last = ops % 2 ? 1 : 2, other = 3 - last;
    for (float x : ex.readFloats(last, 0, 0, 16))
      EXPECT_EQ(x, float(ops));
    for (float x : ex.readFloats(other, 0, 0, 16))
      EXPECT_EQ(x, float(ops - 1));
  }
}

TEST(CalibrateExec, BadSizesRefused) {
  EXPECT_THROW(addChainPlan(0, 16), Error);
  EXPECT_THROW(addChainPlan(4, 0), Error);
  auto be = cpu();
  EXPECT_THROW(measureExecutorOpOverhead(*be, 0.01, 64, 64), Error);
}

TEST(CalibrateExec, LargerProgramTakesLonger) {
  // 16x the instructions: no busy neighbour makes the best of the larger
  // program's steps faster than the smaller's.
  auto be = cpu();
  ExecOpOverhead r = measureExecutorOpOverhead(*be, 0.05);
  EXPECT_EQ(r.opsSmall, 64);
  EXPECT_EQ(r.opsLarge, 1024);
  EXPECT_GT(r.stepLargeS, r.stepSmallS);
  EXPECT_GT(r.perOpS, 0);
  EXPECT_DOUBLE_EQ(r.perOpS, (r.stepLargeS - r.stepSmallS) / (1024 - 64));
}

TEST(RankThreads, FirstFailureNamedAndWaitersFreed) {
  // Rank 1 fails at once; ranks 0 and 2 wait in a barrier that needs it:
  // the world's abort frees them (with errors of their own), and the first
  // failure stays rank 1's.
  for (bool crash : {false, true}) {
    auto world = createLocalWorld(3);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (int r = 0; r < 3; ++r)
      comms.push_back(world->connect(r));
    RankThreadsEnd end = runOnRankThreads(*world, [&](int r) {
      if (r != 1)
        comms[r]->barrier();
      else if (crash)
        throw RankCrashed(1, 3);
      else
        fail("boom");
    });
    EXPECT_EQ(end.firstFailed, 1);
    ASSERT_EQ(end.errors.size(), 3u);
    EXPECT_NE(end.errors[1].find(crash ? "died" : "boom"), std::string::npos)
        << end.errors[1];
    EXPECT_FALSE(end.errors[0].empty());
    EXPECT_FALSE(end.errors[2].empty());
    EXPECT_EQ(end.crashed, crash ? std::vector<int>{1} : std::vector<int>{});
  }
}

TEST(RankThreads, CleanWorld) {
  auto world = createLocalWorld(2);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < 2; ++r)
    comms.push_back(world->connect(r));
  RankThreadsEnd end =
      runOnRankThreads(*world, [&](int r) { comms[r]->barrier(); });
  EXPECT_EQ(end.firstFailed, -1);
  EXPECT_EQ(end.errors, std::vector<std::string>(2));
  EXPECT_TRUE(end.crashed.empty());
}

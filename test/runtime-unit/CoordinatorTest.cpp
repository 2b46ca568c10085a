//===- CoordinatorTest.cpp - MegaFBD's bit-vector coordinator -------------===//
//
// Three ranks issue the same three all-reduces (A over {0,1}, B over {1,2},
// C over {0,2}) in conflicting orders: rank 0 A then C, rank 1 B then A,
// rank 2 C then B — a cycle of waits. Issued directly, every rank times out
// naming the one rank it waits for; through the coordinator all complete in
// one table round, with the same bits on every run.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Coordinator.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

using namespace mapp::rt;

namespace {

const std::vector<std::vector<int>> kGroups = {{0, 1}, {1, 2}, {0, 2}};
const std::vector<std::vector<int>> kOrder = {{0, 2}, {1, 0}, {2, 1}};

/// Runs fn(comm) on 3 rank threads (no abort: each rank reports its own
/// failure); returns the errors ("" = none).
std::vector<std::string> onThreeRanks(
    double timeout, const std::function<void(Communicator &)> &fn) {
  std::unique_ptr<LocalWorld> w = createLocalWorld(3);
  std::vector<std::string> err(3);
  std::vector<std::thread> ts;
  for (int r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Communicator> c = w->connect(r);
      c->setTimeout(timeout);
      try {
        fn(*c);
      } catch (const std::exception &e) {
        err[r] = e.what();
      }
    });
  for (auto &t : ts)
    t.join();
  return err;
}

/// A value every rank's contribution to op `g` makes distinct.
float contribution(int rank, int g) { return 1.0f / (3 + rank) + 0.1f * g; }

} // namespace

TEST(Coordinator, ConflictingOrdersTimeOutWithout) {
  std::vector<std::string> err = onThreeRanks(0.3, [](Communicator &c) {
    for (int g : kOrder[c.rank()]) {
      float x = contribution(c.rank(), g);
      c.allReduce(&x, 1, ReduceOp::Sum, CommGroup{"ranks", kGroups[g]});
    }
  });
  // Rank 0 waits in A for 1, rank 1 in B for 2, rank 2 in C for 0.
  const char *waiting[] = {"waiting for rank(s) 1 ", "waiting for rank(s) 2 ",
                           "waiting for rank(s) 0 "};
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(err[r].find("timed out"), std::string::npos) << err[r];
    EXPECT_NE(err[r].find(waiting[r]), std::string::npos) << err[r];
  }
}

TEST(Coordinator, ConflictingOrdersCompleteWith) {
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 3; ++run) {
    std::vector<std::vector<float>> got(3, std::vector<float>(3, 0));
    std::vector<int> rounds(3);
    std::vector<std::string> err = onThreeRanks(5, [&](Communicator &c) {
      int r = c.rank();
      std::vector<CoordinatedOp> ops;
      for (int g : kOrder[r]) // posted in the conflicting order
        ops.push_back({g, kGroups[g], [&c, &got, r, g] {
                         float x = contribution(r, g);
                         c.allReduce(&x, 1, ReduceOp::Sum,
                                     CommGroup{"ranks", kGroups[g]});
                         got[r][g] = x;
                       }});
      CommGroup world{"world", {0, 1, 2}};
      rounds[r] = coordinate(c, world, 3, std::move(ops)).rounds;
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(err[r], "") << "rank " << r;
      EXPECT_EQ(rounds[r], 2) << "one round fires all, one sees none left";
      for (int g : kOrder[r]) {
        float want = 0; // member order, as the communicator adds
        for (int m : kGroups[g])
          want += contribution(m, g);
        EXPECT_FLOAT_EQ(got[r][g], want);
      }
    }
    if (run == 0)
      first = got;
    else
      for (int r = 0; r < 3; ++r)
        EXPECT_EQ(std::memcmp(first[r].data(), got[r].data(), 3 * sizeof(float)),
                  0);
  }
}

TEST(Coordinator, UnpostedOpIsAnError) {
  std::vector<std::string> err = onThreeRanks(5, [](Communicator &c) {
    std::vector<CoordinatedOp> ops;
    int r = c.rank();
    for (int g : kOrder[r])
      if (!(r == 2 && g == 2)) // rank 2 never posts C
        ops.push_back({g, kGroups[g], [&c, g] {
                         float x = 1;
                         c.allReduce(&x, 1, ReduceOp::Sum,
                                     CommGroup{"ranks", kGroups[g]});
                       }});
    coordinate(c, CommGroup{"world", {0, 1, 2}}, 3, std::move(ops));
  });
  EXPECT_NE(err[0].find("op 2 can never fire: rank(s) 2 did not post it"),
            std::string::npos)
      << err[0];
  EXPECT_NE(err[1].find("coordinator: no operation can fire"), std::string::npos)
      << err[1];
}

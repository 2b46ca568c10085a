//===- SchedulesTest.cpp - property test of the schedule generators -------===//
//
// Over random (p, v, m, N) with p ∈ {2, 4, 8}, v ∈ {1, 2, 4}, m ∈ {p … 4p}
// and random per-chunk costs, every generated table verifies and its
// simulation matches the closed forms: 1F1B and interleaved (any group N
// dividing m) take (v·m + p − 1)(F + B) with bubble (p − 1)/(v·m + p − 1),
// rank r warms up with min(2(p − r − 1) + (v − 1)·N, v·m) forwards
// (1F1B: min(p − r − 1, m)) and holds one more in flight; ZB-H1 takes
// m(F + B + W) + (p − 1)(F + B − W) (for W ≤ F, B) with at most p in
// flight; GPipe holds all m.
//
//===----------------------------------------------------------------------===//
#include "mapp/Transforms/Schedules.h"

#include <gtest/gtest.h>

#include <random>

using namespace mapp;
using namespace mapp::sched;

namespace {

struct Draw {
  int64_t p, v, m, n;
  Costs costs;
};

std::string describe(const std::string &kind, const Draw &d) {
  return kind + " p=" + std::to_string(d.p) + " v=" + std::to_string(d.v) +
         " m=" + std::to_string(d.m) + " N=" + std::to_string(d.n) +
         " F=" + std::to_string(d.costs.forward) +
         " B=" + std::to_string(d.costs.backward) +
         " W=" + std::to_string(d.costs.backwardWeight);
}

Stats generateAndVerify(const std::string &kind, const Draw &d,
                        int64_t group = 0) {
  Schedule s;
  std::string error;
  EXPECT_TRUE(generate(kind, d.p, d.v, d.m, s, error, group))
      << describe(kind, d) << ": " << error;
  Stats stats;
  EXPECT_TRUE(verify(s, d.costs, stats, error))
      << describe(kind, d) << ": " << error;
  return stats;
}

/// Interleaved family (N = group) and 1F1B (v = 1).
void checkInterleaved(const std::string &kind, const Draw &d, int64_t group) {
  Stats st = generateAndVerify(kind, d, group);
  if (st.warmupForwards.empty())
    return;
  double fb = d.costs.forward + d.costs.backward;
  int64_t p = d.p, v = d.v, m = d.m, total = v * m;
  EXPECT_DOUBLE_EQ(st.makespan, (total + p - 1) * fb) << describe(kind, d);
  EXPECT_NEAR(st.bubble, double(p - 1) / (total + p - 1), 1e-12)
      << describe(kind, d);
  for (int64_t r = 0; r < p; ++r) {
    int64_t warm = v == 1 ? std::min(p - r - 1, m)
                          : std::min(2 * (p - r - 1) + (v - 1) * d.n, total);
    int64_t inFlight = std::min(warm + 1, total);
    EXPECT_EQ(st.warmupForwards[r], inFlight) << describe(kind, d) << " r" << r;
    EXPECT_EQ(st.peakInFlight[r], inFlight) << describe(kind, d) << " r" << r;
    EXPECT_NEAR(st.rankBubble[r], double(p - 1) / (total + p - 1), 1e-12)
        << describe(kind, d) << " r" << r;
  }
}

} // namespace

TEST(Schedules, RandomParametersMatchTheClosedForms) {
  std::mt19937_64 rng(14);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t ps[] = {2, 4, 8}, vs[] = {1, 2, 4};
  int checked = 0;
  for (int i = 0; i < 400; ++i) {
    Draw d;
    d.p = ps[pick(0, 2)];
    d.v = vs[pick(0, 2)];
    d.m = pick(d.p, 4 * d.p);
    // A group N in [p, m] that divides m (m itself always does).
    std::vector<int64_t> groups;
    for (int64_t n = d.p; n <= d.m; ++n)
      if (d.m % n == 0)
        groups.push_back(n);
    d.n = groups[pick(0, groups.size() - 1)];
    d.costs.forward = pick(1, 3);
    d.costs.backward = pick(1, 4);
    d.costs.backwardInput = d.costs.backward;
    d.costs.backwardWeight =
        pick(1, std::min<int64_t>(d.costs.forward, d.costs.backward));

    checkInterleaved("interleaved", d, d.n);
    Draw bfc = d;
    bfc.n = d.m;
    checkInterleaved("bfc", bfc, 0);
    if (d.m % d.p == 0 || d.v == 1) {
      Draw dfc = d;
      dfc.n = d.p;
      checkInterleaved("dfc", dfc, 0);
    }
    if (d.v == 1) {
      checkInterleaved("1f1b", d, 0);
      // GPipe: same time, every microbatch in flight.
      Stats g = generateAndVerify("gpipe", d);
      EXPECT_DOUBLE_EQ(g.makespan, (d.m + d.p - 1) *
                                       (d.costs.forward + d.costs.backward));
      EXPECT_EQ(g.peakInFlight[0], d.m);
      // ZB-H1: the backward split into Bi (cost B) and W.
      Stats z = generateAndVerify("zb-h1", d);
      double F = d.costs.forward, B = d.costs.backwardInput,
             W = d.costs.backwardWeight;
      EXPECT_DOUBLE_EQ(z.makespan, d.m * (F + B + W) + (d.p - 1) * (F + B - W))
          << describe("zb-h1", d);
      for (int64_t r = 0; r < d.p; ++r) {
        EXPECT_LE(z.peakInFlight[r], d.p) << describe("zb-h1", d);
        EXPECT_NEAR(z.rankBubble[r],
                    (d.p - 1) * (F + B - W) / z.makespan, 1e-12)
            << describe("zb-h1", d) << " r" << r;
      }
    }
    // Adaptive: both orders verify, run the same tasks, and the
    // breadth-first one holds at least as much.
    Schedule dfc, bfcS;
    std::string error;
    if (d.m % d.p == 0 || d.v == 1) {
      ASSERT_TRUE(generateAdaptive(d.p, d.v, d.m, dfc, bfcS, error)) << error;
      EXPECT_TRUE(sameTasks(dfc, bfcS));
      Stats a, b;
      ASSERT_TRUE(verify(dfc, d.costs, a, error)) << error;
      ASSERT_TRUE(verify(bfcS, d.costs, b, error)) << error;
      EXPECT_GE(b.peakInFlight[0], a.peakInFlight[0]);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 400);
}

TEST(Schedules, InfeasibleParametersAreRejected) {
  Schedule s;
  std::string error;
  EXPECT_FALSE(generate("interleaved", 4, 2, 8, s, error, 3));
  EXPECT_EQ(error, "interleaved group=3 is outside [p, m] = [4, 8]");
  EXPECT_FALSE(generate("interleaved", 4, 2, 8, s, error, 9));
  EXPECT_EQ(error, "interleaved group=9 is outside [p, m] = [4, 8]");
  EXPECT_FALSE(generate("interleaved", 4, 2, 10, s, error, 4));
  EXPECT_EQ(error, "schedule 'interleaved' needs microbatches (10) to be a "
                   "multiple of its group N = 4 (= p)");
  EXPECT_FALSE(generate("dfc", 4, 2, 6, s, error));
  EXPECT_FALSE(generate("bfc", 4, 2, 3, s, error));
  EXPECT_EQ(error, "schedule 'bfc' with 2 chunks needs at least as many "
                   "microbatches (3) as pipeline stages (4)");
  EXPECT_FALSE(generate("zb-h1", 4, 2, 8, s, error));
  EXPECT_FALSE(generate("1f1b", 4, 1, 8, s, error, 4));
  EXPECT_EQ(error, "group=4 applies to interleaved schedules, not '1f1b'");
  // A table that is not a permutation of the other is told apart.
  Schedule a, b;
  ASSERT_TRUE(generate("1f1b", 2, 1, 2, a, error));
  b = a;
  b.ranks[1][0].microbatch = 1;
  EXPECT_FALSE(sameTasks(a, b));
}

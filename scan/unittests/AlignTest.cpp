//===- AlignTest.cpp - Clock fit on synthetic anchors ---------------------===//

#include "mapp/scan/Align.h"

#include <gtest/gtest.h>

using namespace mapp::scan;

// Two ranks, a collective every millisecond; rank 1's clock runs 50 ppm
// fast and starts 7 ms later. The fit must recover both.
TEST(Align, RecoversOffsetAndDrift) {
  Trace t;
  t.world = 2;
  t.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    t.ranks[r].hdr.rank = r;
    t.ranks[r].hdr.world = 2;
    t.ranks[r].groups[0] = {"dp", {0, 1}};
  }
  auto local = [](int r, double tt) {
    return r == 0 ? tt : 7e6 + tt * (1 + 50e-6);
  };
  for (int k = 0; k < 100; ++k) {
    double end = 1e6 * (k + 1);
    for (int r = 0; r < 2; ++r) {
      Event e;
      e.id = k;
      e.name = "ar";
      e.cat = Cat::Comm;
      e.op = Op::AllReduce;
      e.group = 0;
      e.seq = k;
      e.b = (int64_t)local(r, end - 1000 * (r + 1));
      e.e = (int64_t)local(r, end);
      t.ranks[r].events.push_back(e);
    }
  }
  Matches m = matchEvents(t);
  ASSERT_EQ(m.colls.size(), 100u);
  AlignResult a = alignClocks(t, m, {});
  EXPECT_NEAR(a.clocks[1].driftPpm, -50, 0.1);
  EXPECT_LT(a.collMaxNs, 5);
  for (int k = 0; k < 100; ++k)
    EXPECT_NEAR(t.ranks[1].events[k].ge, t.ranks[0].events[k].ge, 5);
}

// Two ranks of one host reading its monotonic clock ("steady"), whose
// collective exits drift apart by 10 us per collective: scheduling on an
// oversubscribed host, not clock drift. Tied as one clock, the mapping is
// the identity; as different hosts, the anchors bend it by ~10000 ppm
// (the regression: single-host runs were fitted thousands of ppm off).
static Trace skewedExits(const std::string &host1) {
  Trace t;
  t.world = 2;
  t.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    t.ranks[r].hdr.rank = r;
    t.ranks[r].hdr.world = 2;
    t.ranks[r].hdr.clock = "steady";
    t.ranks[r].hdr.host = r ? host1 : "node0";
    t.ranks[r].groups[0] = {"dp", {0, 1}};
  }
  for (int k = 0; k < 100; ++k) {
    double end = 1e6 * (k + 1);
    for (int r = 0; r < 2; ++r) {
      Event e;
      e.id = k;
      e.name = "ar";
      e.cat = Cat::Comm;
      e.op = Op::AllReduce;
      e.group = 0;
      e.seq = k;
      e.b = (int64_t)(end - 5000);
      e.e = (int64_t)(end + (r ? 1e4 * k : 0));
      t.ranks[r].events.push_back(e);
    }
  }
  return t;
}

TEST(Align, RanksOfOneHostShareItsClock) {
  Trace t = skewedExits("node0");
  Matches m = matchEvents(t);
  AlignResult a = alignClocks(t, m, {});
  EXPECT_EQ(a.sharedClocks, 1u);
  // The tie is a weighted equation (1e3 vs 1 per anchor), not an
  // elimination: 1 ms of skewed anchors leave it ~0.2 ppm / 20 us off.
  EXPECT_NEAR(a.clocks[1].driftPpm, 0, 1);
  for (int k = 0; k < 100; ++k)
    EXPECT_NEAR(t.ranks[1].events[k].gb, t.ranks[0].events[k].gb, 50);

  Trace u = skewedExits("node1");
  AlignResult b = alignClocks(u, matchEvents(u), {});
  EXPECT_EQ(b.sharedClocks, 0u);
  EXPECT_LT(b.clocks[1].driftPpm, -5000);
}

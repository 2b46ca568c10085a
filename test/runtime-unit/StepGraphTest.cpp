//===- StepGraphTest.cpp - when a step is captured, replayed or eager -----===//
//
// StepGraphCache (docs/cuda-graphs.md) against closed forms: for a run of N
// steps whose key changes at known steps, every new key costs one eager
// (warm-up) step and one capture, a key seen again within the cache's
// capacity replays at once, and a key that never holds for two steps in a
// row never captures.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/StepGraph.h"
#include "mapp/rt/Error.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

StepGraphKey key(const std::string &schedule, int switchOn = 0,
                 double lossScale = 1) {
  StepGraphKey k;
  k.schedule = schedule;
  k.switches = {{switchOn, 0.5}};
  k.lossScale = lossScale;
  return k;
}

/// Runs `steps` steps with keyAt(step); returns the actions as a string of
/// E(ager), C(apture), R(eplay).
std::string run(StepGraphCache &c, int steps,
                const std::function<StepGraphKey(int)> &keyAt) {
  std::string s;
  for (int i = 0; i < steps; ++i) {
    uint64_t id = 0;
    StepGraphAction a = c.next(keyAt(i), id);
    s += a == StepGraphAction::Eager ? 'E' : a == StepGraphAction::Capture ? 'C' : 'R';
    EXPECT_EQ(id == 0, a == StepGraphAction::Eager) << "step " << i;
  }
  return s;
}

} // namespace

TEST(StepGraphCache, SteadyKeyWarmsCapturesOnceThenReplays) {
  StepGraphCache c;
  const int n = 20;
  EXPECT_EQ(run(c, n, [](int) { return key("static"); }),
            "EC" + std::string(n - 2, 'R'));
  EXPECT_EQ(c.eagerSteps(), 1);
  EXPECT_EQ(c.captures(), 1);
  EXPECT_EQ(c.replays(), n - 2);
  EXPECT_TRUE(c.takeEvicted().empty());
}

TEST(StepGraphCache, ScheduleSwitchAtStepKRecaptures) {
  // A switch at k: the new table warms at k, is captured at k+1.
  for (int k : {2, 5, 13}) {
    StepGraphCache c;
    const int n = 20;
    std::string got = run(c, n, [k](int i) {
      return key(i < k ? "static:1f1b" : "static:zb");
    });
    EXPECT_EQ(got, "EC" + std::string(k - 2, 'R') + "EC" +
                       std::string(n - k - 2, 'R'))
        << "k=" << k;
    EXPECT_EQ(c.captures(), 2);
    EXPECT_EQ(c.replays(), n - 4);
    EXPECT_EQ(c.size(), 2u);
  }
}

TEST(StepGraphCache, PerturbationOnAndOffReplaysTheCachedGraph) {
  // A switch on at step 8 and off at 12: the unperturbed graph is still
  // cached, so step 12 replays it with no warm-up.
  StepGraphCache c;
  std::string got =
      run(c, 20, [](int i) { return key("static", i >= 8 && i < 12); });
  EXPECT_EQ(got, "ECRRRRRR" "ECRR" "RRRRRRRR");
  EXPECT_EQ(c.captures(), 2);
  EXPECT_EQ(c.eagerSteps(), 2);
  EXPECT_EQ(c.replays(), 16);
}

TEST(StepGraphCache, LossScaleChangesEveryThirdStep) {
  // Dynamic loss scaling doubling every third step: each value is new, so
  // each costs E, C and replays once: n/3 of each.
  StepGraphCache c(2);
  const int n = 30;
  std::string got =
      run(c, n, [](int i) { return key("static", 0, double(1 << (i / 3))); });
  std::string want;
  for (int i = 0; i < n / 3; ++i)
    want += "ECR";
  EXPECT_EQ(got, want);
  EXPECT_EQ(c.captures(), n / 3);
  // Capacity 2: all but the last two graphs were evicted, oldest first.
  std::vector<uint64_t> ev = c.takeEvicted();
  ASSERT_EQ(ev.size(), size_t(n / 3 - 2));
  for (size_t i = 0; i < ev.size(); ++i)
    EXPECT_EQ(ev[i], i + 1);
}

TEST(StepGraphCache, KeyChangingEveryStepNeverCaptures) {
  StepGraphCache c;
  EXPECT_EQ(run(c, 12, [](int i) { return key("static", i % 2); }),
            std::string(12, 'E'));
  EXPECT_EQ(c.captures(), 0);
}

TEST(StepGraphCache, CapacityOneAlternatingKeysEvictsEachOther) {
  // A A B B A A ...: with room for one graph, every return to a key warms
  // it up again and evicts the other.
  StepGraphCache c(1);
  std::string got =
      run(c, 12, [](int i) { return key((i / 2) % 2 ? "b" : "a"); });
  EXPECT_EQ(got, "ECECECECECEC");
  EXPECT_EQ(c.takeEvicted().size(), 5u);
  // With room for two, the third pair replays.
  StepGraphCache c2(2);
  EXPECT_EQ(run(c2, 12, [](int i) { return key((i / 2) % 2 ? "b" : "a"); }),
            "ECECRRRRRRRR");
}

TEST(StepGraphCache, TracedStepsCaptureEachMarkBankOnce) {
  // Traced steps alternate the backend's two mark banks (a graph records
  // into the events it was captured with): the first bank warms up, the
  // second is captured at once (same work), the first too when it comes
  // back. Sampling 3 traced steps in 6: the untraced step is the same work
  // too, captured at its first step; then every step replays.
  auto traced = [](int i) {
    StepGraphKey k = key("static");
    k.traceBank = i % 6 < 3 ? i % 2 : -1;
    return k;
  };
  StepGraphCache c;
  EXPECT_EQ(run(c, 18, traced), "ECC" "CRR" "RRR" "RRR" "RRR" "RRR");
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.eagerSteps(), 1);
  // Every step traced: E C C then replays.
  StepGraphCache all;
  EXPECT_EQ(run(all, 8, [&](int i) { return traced(i % 2); }), "ECCRRRRR");
  StepGraphKey k = key("a");
  k.traceBank = 1;
  EXPECT_NE(k, key("a"));
  EXPECT_TRUE(k.sameWork(key("a")));
  EXPECT_EQ(k.str(), "schedule=a switches=[0:0.5] loss_scale=1 trace_bank=1");
}

TEST(StepGraphCache, ForgetAndClearWarmUpAgain) {
  StepGraphCache c;
  uint64_t id = 0;
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Eager);
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Capture);
  uint64_t captured = id;
  c.forget(captured); // e.g. the capture failed
  EXPECT_EQ(c.takeEvicted(), std::vector<uint64_t>{captured});
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Eager);
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Capture);
  EXPECT_NE(id, captured); // ids are never reused
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Replay);
  c.clear();
  EXPECT_EQ(c.takeEvicted().size(), 1u);
  EXPECT_EQ(c.next(key("s"), id), StepGraphAction::Eager);
  EXPECT_EQ(c.size(), 0u);
}

TEST(StepGraphCache, KeysDifferInEachField) {
  EXPECT_NE(key("a"), key("b"));
  EXPECT_NE(key("a", 0), key("a", 1));
  EXPECT_NE(key("a", 0, 1), key("a", 0, 2));
  StepGraphKey m = key("a");
  m.switches[0].second = 0.25; // another magnitude
  EXPECT_NE(m, key("a"));
  EXPECT_EQ(key("a").str(), "schedule=a switches=[0:0.5] loss_scale=1");
  EXPECT_THROW(StepGraphCache(0), Error);
}

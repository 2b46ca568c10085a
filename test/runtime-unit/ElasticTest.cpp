//===- ElasticTest.cpp - the elastic job's choices (docs/elastic.md) ------===//
//
// Known answers: which layout fits the ranks left (dp shrinks first), which
// ranks a failure text names as gone (mpirun's and mapp-run's own words),
// and the metrics lines a restart keeps.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Elastic.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <algorithm>

using namespace mapp::rt;

namespace {
ElasticLayout layout(int tp, int pp, int dp) {
  ElasticLayout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.world = tp * pp * dp;
  l.plan = std::to_string(tp) + "-" + std::to_string(pp) + "-" +
           std::to_string(dp);
  return l;
}
} // namespace

TEST(Elastic, LargestLayoutThatFitsDpShrinksFirst) {
  std::vector<ElasticLayout> ls = {layout(2, 2, 2), layout(2, 2, 1),
                                   layout(4, 1, 1), layout(1, 1, 1),
                                   layout(1, 2, 2)};
  const ElasticLayout &cur = ls[0];
  EXPECT_EQ(chooseLayout(ls, 8, cur)->plan, "2-2-2");
  // 7 left: three 4-rank layouts fit; the one keeping tp 2 x pp 2 wins.
  EXPECT_EQ(chooseLayout(ls, 7, cur)->plan, "2-2-1");
  // From a tp 1 x pp 2 layout the same choice keeps its tp and pp.
  EXPECT_EQ(chooseLayout(ls, 5, ls[4])->plan, "1-2-2");
  EXPECT_EQ(chooseLayout(ls, 3, cur)->plan, "1-1-1");
  EXPECT_EQ(chooseLayout(ls, 0, cur), nullptr);
  std::vector<ElasticLayout> only8 = {layout(2, 2, 2)};
  EXPECT_EQ(chooseLayout(only8, 7, only8[0]), nullptr);
}

TEST(Elastic, LostRanksFromFailureTexts) {
  // OpenMPI 4.1's words for a kill -9.
  EXPECT_EQ(lostRanksIn("-----\nmpirun noticed that process rank 5 with PID 0 "
                        "on node vm exited on signal 9 (Killed).\n-----\n"),
            std::vector<int>{5});
  EXPECT_EQ(lostRanksIn("mapp-run: rank 5: rank 5 died (injected rank-crash "
                        "at step 25)"),
            std::vector<int>{5});
  // mapp-run's MPI timeout: only the ranks that did not answer are gone;
  // the one waiting in a recv is not.
  EXPECT_EQ(lostRanksIn("mapp-run: rank 1: all_reduce over dp [0,1,2,3] "
                        "(rank 1): timed out after 10 s waiting for rank(s) "
                        "2, 3 (rank 2 did not answer within 2 s: stopped, "
                        "hung or dead; rank 3 is waiting in recv ...)"),
            std::vector<int>{2});
  EXPECT_TRUE(lostRanksIn("mapp-run: data: token id 300 is outside the "
                          "plan's vocab_size 256").empty());
}

TEST(Elastic, TrimKeepsStepsBeforeTheResume) {
  char name[] = "/tmp/mapp-elastic-XXXXXX";
  int fd = mkstemp(name);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(name);
    for (int s = 0; s < 25; ++s)
      out << "{\"step\": " << s << ", \"loss\": 1.5}\n";
  }
  trimJsonlSteps(name, 20);
  std::ifstream in(name);
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  EXPECT_NE(text.find("{\"step\": 19,"), std::string::npos);
  EXPECT_EQ(text.find("{\"step\": 20,"), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 20);
  std::remove(name);
}

// Re-partitioning decisions against closed forms: pp 4, one rank a stage,
// 16 layers; a layer costs 1 ms, on a slow stage 2 ms.
namespace {
// Stage times (s) of one step for `layers` with per-layer costs `perLayer`.
std::vector<double> stageSeconds(const std::vector<int> &layers,
                                 const std::vector<double> &perLayer) {
  std::vector<double> t;
  for (size_t s = 0; s < layers.size(); ++s)
    t.push_back(layers[s] * perLayer[s] * 1e-3);
  return t;
}
} // namespace

TEST(Elastic, WorkLayersFollowTheDataflow) {
  // Forward: layer 0's linear is named (plan layer 0); the norm before it
  // reads layer 0's norm weight; the gelu after it is named by nothing and
  // reads the linear's output; the final norm reads gelu's output but a
  // weight of no layer (the head's); the loss reads only the head's output.
  // Backward (an earlier block, to need the second pass): gelu's gradient
  // reads gelu's input. The optimizer's update reads layer 0's weight.
  Program p;
  auto value = [&](const std::string &name, ValueKind k) {
    Value v;
    v.name = name;
    v.kind = k;
    p.values.push_back(v);
    return static_cast<int>(p.values.size()) - 1;
  };
  const int x = value("tokens", ValueKind::Input),
            lnW = value("layers.0.ln.weight", ValueKind::Param),
            fcW = value("layers.0.fc.weight", ValueKind::Param),
            headW = value("final_norm.weight", ValueKind::Param),
            fcG = value("layers.0.fc.weight.grad", ValueKind::Grad),
            h = value("", ValueKind::Temp), a = value("", ValueKind::Temp),
            g = value("", ValueKind::Temp), y = value("", ValueKind::Temp),
            loss = value("loss", ValueKind::Loss),
            dg = value("", ValueKind::Temp), da = value("", ValueKind::Temp);
  auto instr = [](const char *k, std::vector<int> in, std::vector<int> out,
                  int layer = -1) {
    Instr i;
    i.kernel = k;
    i.inputs = std::move(in);
    i.outputs = std::move(out);
    i.layer = layer;
    return i;
  };
  Block backward, forward, optimizer;
  backward.instrs = {instr("gelu_grad", {dg, a}, {da})};
  forward.instrs = {instr("layer_norm", {x, lnW}, {h}),
                    instr("linear", {h, fcW}, {a}, 0),
                    instr("gelu", {a}, {g}),
                    instr("layer_norm", {g, headW}, {y}),
                    instr("cross_entropy", {y}, {loss})};
  optimizer.instrs = {instr("adamw", {fcW, fcG}, {})};
  p.blocks = {backward, forward, optimizer};
  const std::vector<std::vector<int>> want = {
      {0}, {0, 0, 0, -1, -1}, {0}};
  EXPECT_EQ(workLayers(p), want);
}

TEST(Elastic, RebalancerEquivalentCandidatesDoNotSplitTheVote) {
  // Stage 1 twice as slow; 4,4,4,4 takes 8 ms (4 layers x 2 ms). Three
  // candidates give stage 1 two layers and one of the others four: each is
  // predicted about 5 ms, the best by about 8 / 5 = 1.6x. Which of them is best in a
  // step depends on which other stage is 2% heavier, and that rotates (as
  // measurement noise does): each is the single best in a third of the
  // steps, yet moving is right in every step. Regression: the switch needed
  // one candidate to be the single best in 80% of the steps, so near-equal
  // candidates split the vote and the job never moved.
  const std::vector<std::vector<int>> parts = {
      {4, 4, 4, 4}, {4, 2, 5, 5}, {5, 2, 4, 5}, {5, 2, 5, 4}};
  Rebalancer rb(parts, 0, /*pp=*/4, /*tp=*/1, /*dp=*/1);
  for (int step = 0; step < 9; ++step) {
    std::vector<double> perLayer = {1, 2, 1, 1};
    perLayer[std::vector<int>{0, 2, 3}[step % 3]] = 1.02;
    rb.addStep(stageSeconds(parts[0], perLayer));
  }
  std::string evidence;
  int to = rb.decide(&evidence);
  ASSERT_GE(to, 1) << evidence;
  auto e = nlohmann::json::parse(evidence);
  // In two steps of three another stage than the target's four-layer one
  // is the heavy one: the median step predicts 5 x 1.02 ms.
  EXPECT_NEAR(e["predicted_gain"].get<double>(), 8 / 5.1, 1e-9) << evidence;
  EXPECT_EQ(e["votes"].get<int>(), 9) << evidence; // beats 4,4,4,4 in each
}

TEST(Elastic, RebalancerPrefersTheNearerOfPartitionsPredictedAlike) {
  // On 6,2,4,4 with stage 1 twice as slow (per-layer 1.01, 2, 0.99, 0.99
  // ms): the current step takes 6.06 ms; 4,2,5,5 is predicted 4.95 ms and
  // 5,2,5,4 5.05 ms, 2% apart: alike. The nearer one (2 layers moved, not
  // 4) is the target; the linear prediction is surest close to the
  // current partition. With 4,2,5,5 a clear 22% ahead (beyond the 10%) it
  // is chosen.
  const std::vector<std::vector<int>> parts = {
      {4, 4, 4, 4}, {6, 2, 4, 4}, {4, 2, 5, 5}, {5, 2, 5, 4}};
  Rebalancer alike(parts, 1, 4, 1, 1), clear(parts, 1, 4, 1, 1);
  for (int step = 0; step < 10; ++step) {
    alike.addStep(stageSeconds(parts[1], {1.01, 2, 0.99, 0.99}));
    clear.addStep(stageSeconds(parts[1], {1.1, 2, 0.9, 0.9}));
  }
  std::string evidence;
  EXPECT_EQ(alike.decide(&evidence), 3) << evidence;
  EXPECT_NEAR(nlohmann::json::parse(evidence)["predicted_gain"].get<double>(),
              6.06 / 5.05, 1e-9);
  EXPECT_EQ(clear.decide(&evidence), 2) << evidence;
}

TEST(Elastic, RebalancerMovesBackWhenTheFaultEnds) {
  // On 5,2,5,4 with every layer 1 ms again: 4,4,4,4 takes 4 ms, the
  // current 5 ms -> back, gain 5 / 4 = 1.25.
  const std::vector<std::vector<int>> parts = {
      {4, 4, 4, 4}, {5, 2, 5, 4}, {5, 1, 5, 5}};
  Rebalancer rb(parts, 1, 4, 1, 1);
  for (int step = 0; step < 10; ++step)
    rb.addStep(stageSeconds(parts[1], {1, 1, 1, 1}));
  std::string evidence;
  EXPECT_EQ(rb.decide(&evidence), 0) << evidence;
  EXPECT_NEAR(nlohmann::json::parse(evidence)["predicted_gain"].get<double>(),
              1.25, 1e-9);
}

TEST(Elastic, RebalancerMovesBackDespiteTheStagesFixedCosts) {
  // On 6,2,4,4 with the fault over: each layer 1 ms and each stage 1.5 ms
  // of its own (p2p, bookkeeping): stage times 7.5, 3.5, 5.5, 5.5 ms.
  // Scaling whole stage times, stage 1 with 4 layers would take 7 ms and
  // going back would gain only 7.5 / 7 (stay: the regression seen on busy
  // cores, where the fixed part grows). With the layers' part known,
  // 4,4,4,4 takes 5.5 ms: back, gain 7.5 / 5.5.
  const std::vector<std::vector<int>> parts = {{4, 4, 4, 4}, {6, 2, 4, 4}};
  Rebalancer split(parts, 1, 4, 1, 1), whole(parts, 1, 4, 1, 1);
  for (int step = 0; step < 10; ++step) {
    std::vector<double> layers = stageSeconds(parts[1], {1, 1, 1, 1}), t;
    for (double l : layers)
      t.push_back(l + 1.5e-3);
    split.addStep(t, layers);
    whole.addStep(t);
  }
  std::string evidence;
  EXPECT_EQ(whole.decide(nullptr), -1);
  EXPECT_EQ(split.decide(&evidence), 0) << evidence;
  auto e = nlohmann::json::parse(evidence);
  EXPECT_NEAR(e["predicted_gain"].get<double>(), 7.5 / 5.5, 1e-9);
  EXPECT_NEAR(e["stage_fixed_ms"][1].get<double>(), 1.5, 1e-9);
}

TEST(Elastic, RebalancerIgnoresAStragglerThatComesAndGoes) {
  // Stage 1 slow in every other step: 5,2,5,4 is 1.6x faster in the slow
  // steps and 1.25x slower in the clean ones: half the window, no switch;
  // the same window all slow does switch.
  const std::vector<std::vector<int>> parts = {{4, 4, 4, 4}, {5, 2, 5, 4}};
  Rebalancer flapping(parts, 0, 4, 1, 1), steady(parts, 0, 4, 1, 1);
  for (int step = 0; step < 10; ++step) {
    flapping.addStep(stageSeconds(parts[0], {1, step % 2 ? 2.0 : 1.0, 1, 1}));
    steady.addStep(stageSeconds(parts[0], {1, 2, 1, 1}));
  }
  EXPECT_EQ(flapping.decide(nullptr), -1);
  EXPECT_EQ(steady.decide(nullptr), 1);
}

TEST(Elastic, RebalancerNeedsTheMinimumGain) {
  // Stage 1 1.2x slow: 4,4,4,4 takes 4.8 ms; 5,3,4,4 max(5, 3.6) = 5 ms is
  // slower, 4,3,5,4 likewise: stay (a gain below 1.15 moves nothing).
  const std::vector<std::vector<int>> parts = {
      {4, 4, 4, 4}, {5, 3, 4, 4}, {4, 3, 5, 4}};
  Rebalancer rb(parts, 0, 4, 1, 1);
  for (int step = 0; step < 10; ++step)
    rb.addStep(stageSeconds(parts[0], {1, 1.2, 1, 1}));
  EXPECT_EQ(rb.decide(nullptr), -1);
}

TEST(Elastic, RebalancerGoesHomeAtTheLowerBar) {
  // On 4,2,5,5 after the fault, stage 1's core still 12% slower than the
  // others (a busy sibling): 4,4,4,4 is predicted max(4, 4 x 1.12) = 4.48
  // ms against 5 now, a gain of 1.116. Home (the job's first partition)
  // needs kHomeGain: back. Without a home, 1.15: stay. Away from home the
  // same gain moves nothing (RebalancerNeedsTheMinimumGain, with a home).
  const std::vector<std::vector<int>> parts = {{4, 4, 4, 4}, {4, 2, 5, 5}};
  Rebalancer homed(parts, 1, 4, 1, 1), homeless(parts, 1, 4, 1, 1);
  homed.setHome(0);
  Rebalancer away({{4, 4, 4, 4}, {5, 3, 4, 4}, {4, 3, 5, 4}}, 0, 4, 1, 1);
  away.setHome(0);
  for (int step = 0; step < 10; ++step) {
    homed.addStep(stageSeconds(parts[1], {1, 1.12, 1, 1}));
    homeless.addStep(stageSeconds(parts[1], {1, 1.12, 1, 1}));
    away.addStep(stageSeconds({4, 4, 4, 4}, {1, 1.2, 1, 1}));
  }
  std::string evidence;
  EXPECT_EQ(homed.decide(&evidence), 0) << evidence;
  EXPECT_NEAR(nlohmann::json::parse(evidence)["predicted_gain"].get<double>(),
              5 / 4.48, 1e-9);
  EXPECT_EQ(homeless.decide(nullptr), -1);
  EXPECT_EQ(away.decide(nullptr), -1);
}

TEST(Elastic, ElasticReportRoundTripsThroughInterleavedStderr) {
  // mpirun interleaves every rank's stderr; the supervisor takes the last
  // report line wherever it sits, and a garbled one is an error, not a
  // silent "no switch".
  ElasticReport r;
  r.switchTo = "off1.mplan";
  r.evidence = R"({"layers_next":[6,2,4,4],"predicted_gain":1.5})";
  r.windowStepMs = 12.5;
  std::string text = "mapp-run: rank 2 scheduler static: ...\n" +
                     formatElasticReport(ElasticReport{"", "", 9.0}) +
                     "[1,3]<stderr>: a tagged line\n" +
                     formatElasticReport(r) + "mapp-run: monitor: done\n";
  ElasticReport got = lastElasticReport(text);
  EXPECT_EQ(got.switchTo, "off1.mplan");
  EXPECT_EQ(nlohmann::json::parse(got.evidence)["layers_next"][0], 6);
  EXPECT_DOUBLE_EQ(got.windowStepMs, 12.5);
  ElasticReport none = lastElasticReport("mapp-run: nothing to report\n");
  EXPECT_TRUE(none.switchTo.empty());
  EXPECT_EQ(none.windowStepMs, 0);
  ElasticReport measured =
      lastElasticReport(formatElasticReport(ElasticReport{"", "", 9.0}));
  EXPECT_TRUE(measured.switchTo.empty());
  EXPECT_DOUBLE_EQ(measured.windowStepMs, 9.0);
  EXPECT_THROW(lastElasticReport(std::string(kElasticReportTag) + "{\"swi\n"),
               Error);
}

TEST(Elastic, DpBalancerGivesASlowReplicaItsShareAndTakesItBack) {
  // dp 2 x 4 microbatches, tp 2 (ranks 0,1 replica 0; 2,3 replica 1).
  // Replica 1 three times as slow per microbatch, 0.5 ms optimizer each:
  // the best split is [6,2] (0.5 + 6 = 0.5 + 3 x 2), predicted
  // (0.5 + 12) / 6.5 = 1.92x over [4,4]. Then the fault ends: from [6,2]
  // back to [4,4], (0.5 + 6) / 4.5 = 1.44x. A replica is its slowest rank.
  DpBalancer b(/*dp=*/2, /*tp=*/2, /*microbatches=*/4);
  auto step = [&](std::vector<double> perMb) {
    std::vector<double> total, mb;
    for (int r = 0; r < 4; ++r) {
      const int d = r / 2;
      const double m = b.split()[d] * perMb[d] * (r % 2 ? 0.9 : 1.0);
      mb.push_back(m * 1e-3);
      total.push_back((m + 0.5) * 1e-3);
    }
    b.addStep(total, mb);
  };
  for (int s = 0; s < 10; ++s)
    step({1, 3});
  std::string evidence;
  ASSERT_EQ(b.decide(&evidence), 1) << evidence;
  EXPECT_EQ(b.split(), (std::vector<int>{6, 2}));
  auto e = nlohmann::json::parse(evidence);
  EXPECT_NEAR(e["predicted_gain"].get<double>(), 12.5 / 6.5, 1e-9);
  EXPECT_NEAR(e["replica_fixed_ms"][1].get<double>(), 0.5, 1e-9);
  for (int s = 0; s < 10; ++s)
    step({1, 3});
  EXPECT_EQ(b.decide(nullptr), 0); // balanced: stays
  for (int s = 0; s < 10; ++s)
    step({1, 1});
  ASSERT_EQ(b.decide(&evidence), 1) << evidence;
  EXPECT_EQ(b.split(), (std::vector<int>{4, 4}));
  EXPECT_NEAR(nlohmann::json::parse(evidence)["predicted_gain"].get<double>(),
              6.5 / 4.5, 1e-9);
  // Every microbatch somewhere, at least one each, even for a replica
  // 100x as slow.
  std::vector<GroupTime> t = {{4e-3, 4e-3}, {400e-3, 400e-3}};
  EXPECT_EQ(DpBalancer::bestSplit(t, {4, 4}, 8), (std::vector<int>{7, 1}));
}

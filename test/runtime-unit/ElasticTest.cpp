//===- ElasticTest.cpp - the elastic job's choices (docs/elastic.md) ------===//
//
// Known answers: which layout fits the ranks left (dp shrinks first), which
// ranks a failure text names as gone (mpirun's and mapp-run's own words),
// and the metrics lines a restart keeps.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Elastic.h"

#include <gtest/gtest.h>

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

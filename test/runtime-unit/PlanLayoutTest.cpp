//===- PlanLayoutTest.cpp - the plan verifier's layout checks -------------===//
//
// tp x dp x pp (+ a MegaFBD forward side) = world_size, one program per rank
// at its Megatron coordinates, valid placements: each broken plan is refused
// when it loads, with a message naming what is wrong (the executor no
// longer re-checks). Valid plans of each shape load (the controls).
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

Plan parse(const std::vector<uint8_t> &bytes) {
  std::vector<uint64_t> aligned((bytes.size() + 7) / 8 + 1);
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()),
                   bytes.size());
}

std::string errorOf(const MultiPlanSpec &m) {
  try {
    parse(m.build());
  } catch (const Error &e) {
    return e.what();
  }
  return "<no error>";
}

MlpOptions small() {
  MlpOptions o;
  o.hidden = 4;
  o.ffn = 6;
  o.seq = 3;
  o.microbatches = 2;
  return o;
}

/// tp=2 x dp=2: ranks 0..3 at (tp, dp) = (0,0) (1,0) (0,1) (1,1).
MultiPlanSpec grid() {
  ParallelOptions p;
  p.tp = 2;
  p.dp = 2;
  return parallelMlpPlan(small(), p);
}

/// A MegaFBD-shaped plan: rank 0 the backward side (tp=dp=pp=1), rank 1
/// its forward side (placement tp 1).
MultiPlanSpec split() {
  MultiPlanSpec m;
  PlanSpec bwd = mlpPlan(small()), fwd = mlpPlan(small());
  bwd.rank = 0;
  bwd.placement.role = "bwd";
  bwd.placement.peerRank = 1;
  fwd.rank = 1;
  fwd.placement.role = "fwd";
  fwd.placement.peerRank = 0;
  fwd.placement.tp = 1;
  m.programs = {bwd, fwd};
  return m;
}

struct Case {
  const char *expect;
  std::function<MultiPlanSpec()> make;
};

void expectAll(const std::vector<Case> &cases) {
  for (const Case &c : cases) {
    std::string err = errorOf(c.make());
    EXPECT_NE(err.find(c.expect), std::string::npos)
        << "expected '" << c.expect << "', got '" << err << "'";
  }
}

} // namespace

TEST(PlanLayout, ValidLayoutsLoad) {
  Plan g = parse(grid().build());
  EXPECT_EQ(g.worldSize, 4);
  EXPECT_EQ(g.programs[3].tp, 1);
  EXPECT_EQ(g.programs[3].dp, 1);
  Plan s = parse(split().build());
  EXPECT_EQ(s.worldSize, 2);
  EXPECT_EQ(s.programs[1].placement.role, "fwd");
  ParallelOptions p;
  p.tp = 2;
  p.pp = 2;
  MlpOptions o = small();
  EXPECT_EQ(parse(parallelMlpPlan(o, p).build()).worldSize, 4);
}

TEST(PlanLayout, ProductMustBeTheWorld) {
  expectAll({
      {"plan: tp 3 x dp 2 x pp 1 != world_size 4",
       [] {
         MultiPlanSpec m = grid();
         m.tp = 3;
         return m;
       }},
      {"plan: tp 2 x dp 2 x pp 2 != world_size 4",
       [] {
         MultiPlanSpec m = grid();
         m.pp = 2;
         return m;
       }},
      // Products far past int: no overflow into a match.
      {"plan: tp 65536 x dp 65536 x pp 1 != world_size 4",
       [] {
         MultiPlanSpec m = grid();
         m.tp = m.dp = 65536;
         return m;
       }},
      {"plan: tp 1 x dp 1 x pp 1 + the forward side's ranks != world_size 3",
       [] {
         MultiPlanSpec m = split();
         m.worldSize = 3;
         m.programs[1].placement.peerRank = 0;
         PlanSpec extra = m.programs[0];
         extra.rank = 2;
         extra.placement = Placement();
         m.programs.push_back(extra);
         return m;
       }},
  });
}

TEST(PlanLayout, EveryRankHasAProgram) {
  expectAll({
      {"plan: no program for rank 2 (world_size 4, 3 program(s))",
       [] {
         MultiPlanSpec m = grid();
         m.worldSize = 4;
         m.programs.erase(m.programs.begin() + 2);
         return m;
       }},
      {"plan: programs 1 and 3 are both for rank 1",
       [] {
         MultiPlanSpec m = grid();
         m.programs[3].rank = 1;
         return m;
       }},
  });
}

TEST(PlanLayout, CoordinatesFollowMegatronOrder) {
  expectAll({
      {"plan: program of rank 1 has coordinates (dp 0, pp 0, tp 0), Megatron "
       "order gives (dp 0, pp 0, tp 1)",
       [] {
         MultiPlanSpec m = grid();
         m.programs[1].tp = 0;
         return m;
       }},
      // dp and tp swapped (tp-slowest order) is caught at rank 1 too.
      {"plan: program of rank 1 has coordinates (dp 1, pp 0, tp 0), Megatron "
       "order gives (dp 0, pp 0, tp 1)",
       [] {
         MultiPlanSpec m = grid();
         std::swap(m.programs[1].tp, m.programs[1].dp);
         std::swap(m.programs[2].tp, m.programs[2].dp);
         return m;
       }},
      {"plan: program of rank 3 has coordinates (dp 1, pp 1, tp 1), Megatron "
       "order gives (dp 1, pp 0, tp 1)",
       [] {
         MultiPlanSpec m = grid();
         m.programs[3].pp = 1;
         return m;
       }},
  });
}

TEST(PlanLayout, PlacementsOfASplitPlan) {
  expectAll({
      {"plan: program of rank 1 has placement role 'sideways' (\"\", fwd or "
       "bwd)",
       [] {
         MultiPlanSpec m = split();
         m.programs[1].placement.role = "sideways";
         return m;
       }},
      {"plan: program of rank 0 names peer rank 7 outside the world of 2",
       [] {
         MultiPlanSpec m = split();
         m.programs[0].placement.peerRank = 7;
         return m;
       }},
      {"plan: program of rank 0 names peer rank -3 outside the world of 2",
       [] {
         MultiPlanSpec m = split();
         m.programs[0].placement.peerRank = -3;
         return m;
       }},
      {"plan: a split (MegaFBD) plan without forward programs",
       [] {
         MultiPlanSpec m = split();
         m.programs[1].placement.role = "bwd";
         return m;
       }},
      {"plan: forward programs have placement tp 0 (must be >= 1)",
       [] {
         MultiPlanSpec m = split();
         m.programs[1].placement.tp = 0;
         return m;
       }},
      {"plan: forward programs disagree on their tp (1 and 2)",
       [] {
         MultiPlanSpec m = split();
         PlanSpec f2 = m.programs[1];
         f2.rank = 2;
         f2.placement.tp = 2;
         m.programs.push_back(f2);
         return m;
       }},
      // The forward side follows the backward side's ranks.
      {"plan: program of rank 0 is a forward-side program outside its side's "
       "ranks [1, 2)",
       [] {
         MultiPlanSpec m = split();
         std::swap(m.programs[0].placement, m.programs[1].placement);
         return m;
       }},
  });
}

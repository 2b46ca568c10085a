//===- ScheduleTablesTest.cpp - the loader's checks of MegaDPP tables -----===//
//
// An adaptive plan's schedule tables (plan.fbs ScheduleTable) must name
// existing blocks and microbatches and run exactly Program.tasks; each way
// of breaking one is a loader error naming the table and the task.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <gtest/gtest.h>

#include <algorithm>
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

/// A valid adaptive plan: the MLP plan with two microbatches, its task
/// order as "dfc" and the reversed microbatch order as "bfc".
Plan adaptivePlan() {
  MlpOptions o;
  o.vocab = 16;
  o.hidden = 4;
  o.ffn = 6;
  o.batch = 2;
  o.seq = 3;
  o.microbatches = 2;
  Plan plan = parse(mlpPlan(o).build());
  plan.schedule = "adaptive";
  Program &p = plan.programs[0];
  const std::vector<Task> &tasks = p.tasks; // F0 B0 F1 B1 opt
  ScheduleTable dfc{"dfc", tasks}, bfc{"bfc", tasks};
  std::stable_sort(bfc.tasks.begin(), bfc.tasks.end(),
                   [&](const Task &a, const Task &b) {
                     return p.blocks[a.block].kind < p.blocks[b.block].kind;
                   });
  p.scheduleTables = {dfc, bfc};
  return plan;
}

std::string errorOf(const std::function<void(Plan &)> &edit) {
  Plan plan = adaptivePlan();
  edit(plan);
  try {
    verifyPlan(plan);
  } catch (const Error &e) {
    return e.what();
  }
  return "<no error>";
}

} // namespace

TEST(ScheduleTables, AValidAdaptivePlanVerifies) {
  EXPECT_EQ(errorOf([](Plan &) {}), "<no error>");
  // The two orders really differ (bfc runs both forwards first).
  Plan plan = adaptivePlan();
  const Program &p = plan.programs[0];
  EXPECT_NE(p.scheduleTables[0].tasks[1].microbatch,
            p.scheduleTables[1].tasks[1].microbatch);
}

TEST(ScheduleTables, CorruptTablesNameTheProblem) {
  struct Case {
    const char *expect;
    std::function<void(Plan &)> edit;
  };
  std::vector<Case> cases = {
      {"schedule table 'bfc': task 2 names block 9, which does not exist "
       "(program has 3 blocks)",
       [](Plan &p) { p.programs[0].scheduleTables[1].tasks[2].block = 9; }},
      {"schedule table 'dfc': task 0: microbatch 2 out of range "
       "(num_microbatches 2)",
       [](Plan &p) { p.programs[0].scheduleTables[0].tasks[0].microbatch = 2; }},
      {"schedule table 'bfc': task 1: microbatch -1 out of range",
       [](Plan &p) { p.programs[0].scheduleTables[1].tasks[1].microbatch = -1; }},
      // A task run twice and another never: not a permutation.
      {"schedule table 'bfc' is not a permutation of the program's tasks: "
       "(block 0, microbatch 0) appears 2 time(s), 1 in tasks",
       [](Plan &p) {
         for (Task &t : p.programs[0].scheduleTables[1].tasks)
           if (t.block == 0)
             t.microbatch = 0;
       }},
      {"schedule table 'dfc' is not a permutation of the program's tasks",
       [](Plan &p) { p.programs[0].scheduleTables[0].tasks.pop_back(); }},
      {"adaptive plan has no 'bfc' schedule table",
       [](Plan &p) { p.programs[0].scheduleTables.pop_back(); }},
      {"schedule table 'xfc': unknown name (expected dfc or bfc)",
       [](Plan &p) { p.programs[0].scheduleTables.push_back({"xfc", {}}); }},
      {"schedule table 'dfc' appears twice",
       [](Plan &p) {
         p.programs[0].scheduleTables.push_back(
             p.programs[0].scheduleTables[0]);
       }},
      {"schedule_tables are for adaptive plans, but the schedule is '1f1b'",
       [](Plan &p) { p.schedule = "1f1b"; }},
      {"stash_bytes 1099511627776 exceeds arena_bytes",
       [](Plan &p) { p.programs[0].stashBytes = 1ull << 40; }},
      {"plan: adaptive slow_link_ratio = 0.5 (must be > 1)",
       [](Plan &p) { p.adaptive.slowLinkRatio = 0.5; }},
      {"plan: adaptive bandwidth_smoothing = 0 (must be in (0, 1])",
       [](Plan &p) { p.adaptive.bandwidthSmoothing = 0; }},
      // GPipe's order (F0 F1 B0 B1) keeps both microbatches in flight: one
      // arena slot would let F1 overwrite what B0 reads.
      {"plan: program 0: microbatches 0 and 1 share arena slot 0 (slots = 1) "
       "while both are in flight (task 1 starts 1 before task 2 ends 0): the "
       "plan needs more slots",
       [](Plan &p) {
         Program &prog = p.programs[0];
         prog.slots = 1;
         std::stable_sort(prog.tasks.begin(), prog.tasks.end(),
                          [&](const Task &a, const Task &b) {
                            return prog.blocks[a.block].kind <
                                   prog.blocks[b.block].kind;
                          });
       }},
  };
  for (const Case &c : cases)
    EXPECT_NE(errorOf(c.edit).find(c.expect), std::string::npos)
        << "expected '" << c.expect << "', got '" << errorOf(c.edit) << "'";
}

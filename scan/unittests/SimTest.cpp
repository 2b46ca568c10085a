//===- SimTest.cpp - Engine semantics and fault parsing -------------------===//

#include "mapp/scan/Sim.h"

#include <gtest/gtest.h>

using namespace mapp::scan;

static SimNetwork fixedNet(double p2p, double coll) {
  SimNetwork n;
  n.p2p = [=](int, int, uint64_t) { return p2p; };
  n.coll = [=](const SimGroup &, Op, uint64_t) { return coll; };
  return n;
}

static SimOp compute(double ns) {
  SimOp o;
  o.durNs = ns;
  return o;
}

TEST(SimEngine, RecvEndsAfterSendStartPlusTransfer) {
  SimJob job;
  job.world = 2;
  job.programs.resize(2);
  SimOp s;
  s.kind = SimOp::Send;
  s.peer = 1;
  s.tag = 7;
  SimOp r = s;
  r.kind = SimOp::Recv;
  r.peer = 0;
  job.programs[0] = {compute(100), s};
  job.programs[1] = {r};
  SimTimes t;
  std::string err;
  ASSERT_TRUE(runSim(job, fixedNet(50, 0), t, &err)) << err;
  EXPECT_DOUBLE_EQ(t.ops[0][1].first, 100);
  EXPECT_DOUBLE_EQ(t.ops[0][1].second, 150);
  EXPECT_DOUBLE_EQ(t.ops[1][0].first, 0);
  EXPECT_DOUBLE_EQ(t.ops[1][0].second, 150);
}

TEST(SimEngine, CollectiveMembersLeaveTogether) {
  SimJob job;
  job.world = 3;
  job.groups = {{"dp", {0, 1, 2}}};
  job.programs.resize(3);
  for (int r = 0; r < 3; ++r) {
    SimOp c;
    c.kind = SimOp::Coll;
    c.op = Op::AllReduce;
    c.group = 0;
    c.seq = 0;
    job.programs[r] = {compute(10.0 * (r + 1)), c};
  }
  SimTimes t;
  std::string err;
  ASSERT_TRUE(runSim(job, fixedNet(0, 5), t, &err)) << err;
  for (int r = 0; r < 3; ++r)
    EXPECT_DOUBLE_EQ(t.ops[r][1].second, 35); // last arrival 30 + 5
}

TEST(SimEngine, DeadlockIsReported) {
  SimJob job;
  job.world = 2;
  job.programs.resize(2);
  SimOp r;
  r.kind = SimOp::Recv;
  r.name = "stuck";
  r.tag = 1;
  r.peer = 1;
  job.programs[0] = {r};
  r.peer = 0;
  job.programs[1] = {r};
  SimTimes t;
  std::string err;
  EXPECT_FALSE(runSim(job, fixedNet(1, 1), t, &err));
  EXPECT_NE(err.find("deadlocked"), std::string::npos);
  EXPECT_NE(err.find("rank 1 at op 0 'stuck' (recv from 0 tag 1)"),
            std::string::npos);
}

TEST(SimConfig, SchedulesRunWithoutDeadlock) {
  for (const char *sched : {"gpipe", "1f1b", "interleaved"}) {
    SimConfig c;
    c.tp = 1;
    c.pp = 4;
    c.dp = 2;
    c.microbatches = 8;
    c.chunks = std::string(sched) == "interleaved" ? 2 : 1;
    c.layers = 8;
    c.schedule = sched;
    c.layerForwardUs = 100;
    c.activationBytes = 1 << 20;
    c.dpAllreduceBytes = 1 << 24;
    SimJob job;
    SimTimes t;
    std::string err;
    ASSERT_TRUE(buildSimJob(c, job, &err)) << err;
    ASSERT_TRUE(runSim(job, makeNetwork(c), t, &err)) << sched << ": " << err;
  }
}

TEST(SimConfig, PipelineStepMatchesBubbleFormula) {
  // With free communication both schedules take (m + p - 1) * (F + B):
  // the bubble is (p - 1) / m of the ideal time for either.
  SimConfig c;
  c.pp = 4;
  c.microbatches = 8;
  c.layers = 4;
  c.layerForwardUs = 100;
  c.interGbps = c.intraGbps = 1e9;
  c.interLatencyUs = c.intraLatencyUs = 0;
  c.gradNormAllreduce = false;
  for (const char *sched : {"gpipe", "1f1b"}) {
    c.schedule = sched;
    SimJob job;
    SimTimes t;
    std::string err;
    ASSERT_TRUE(buildSimJob(c, job, &err));
    ASSERT_TRUE(runSim(job, makeNetwork(c), t, &err));
    double step = stepTimesNs(job, t)[0];
    EXPECT_NEAR(step, (8 + 3) * 300e3, 1e3) << sched;
  }
}

TEST(Fault, Parse) {
  Fault f;
  std::string err;
  ASSERT_TRUE(parseFault("link-bandwidth:src=1,dst=5,gbps=2.5", 8, f, &err));
  EXPECT_EQ(f.kind, Fault::LinkBandwidth);
  EXPECT_EQ(f.src, 1);
  EXPECT_EQ(f.dst, 5);
  EXPECT_DOUBLE_EQ(f.value, 2.5);
  EXPECT_FALSE(parseFault("slow-compute:rank=1", 8, f, &err));
  EXPECT_FALSE(parseFault("slow-compute:rank=1,factor=2,extra=1", 8, f, &err));
  EXPECT_NE(err.find("unknown key 'extra'"), std::string::npos);
}

//===- MonitorTest.cpp - MegaScan live's window diagnosis -----------------===//
//
// Synthetic summaries with known answers: 8 ranks of two stages, every op
// bucket costing the same on peers, one rank or link made slower, NVML
// fields saying the GPU throttled.
//
//===----------------------------------------------------------------------===//
#include "mapp/monitor/AlertLog.h"
#include "mapp/monitor/Diagnoser.h"
#include "mapp/monitor/DiagnosisCore.h"

#include <gtest/gtest.h>

using namespace mapp::monitor;

namespace {

constexpr int kWorld = 8; // pp 2 x dp 2 x tp 2: ranks 0-3 stage 0

StepSummary summary(int rank, int step, double slow = 1, double noise = 0) {
  StepSummary s;
  s.rank = rank;
  s.step = step;
  s.pp = rank / 4;
  s.dp = (rank / 2) % 2;
  s.tp = rank % 2;
  s.flags = StepSummary::HasCpu | StepSummary::HasWire;
  for (int b = 0; b < kOpBuckets; ++b) {
    double ns = 1e5 * (1 + b) * slow * (1 + noise * ((rank + b + step) % 3 - 1));
    s.bucketNs[b] = ns;
    s.bucketOps[b] = 2;
    s.cpuNs[ClassCompute] += ns;
    s.wallNs[ClassCompute] += ns;
    s.ops[ClassCompute] += 2;
  }
  // Stage 1 receives from its stage-0 twin (rank - 4), stage 0 from rank + 4.
  PeerStats &p = s.recvFrom[s.recvPeers++];
  p.peer = rank < 4 ? rank + 4 : rank - 4;
  p.count = 4;
  p.bytes = 4 * 32768;
  p.minWireNs = p.minWireLoNs = 20e3; // exact landings: lo = hi
  p.sumWireNs = 4 * 20e3;
  return s;
}

std::vector<Alert> feed(WindowDiagnoser &d, int steps,
                        const std::function<void(StepSummary &)> &edit) {
  std::vector<Alert> all;
  for (int step = 0; step < steps; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      StepSummary s = summary(r, step, 1, 0.02);
      edit(s);
      if (s.rank >= 0)
        d.add(s);
    }
    for (Alert &a : d.poll())
      all.push_back(a);
  }
  for (Alert &a : d.finish())
    all.push_back(a);
  return all;
}

TEST(Monitor, CleanStepsRaiseNothing) {
  WindowDiagnoser d(kWorld);
  EXPECT_TRUE(feed(d, 100, [](StepSummary &) {}).empty());
}

// CI's 2-core host once made a clean rank's every op 1.38x for two steps
// (thread CPU time too): a blip that short is host noise, not a straggler.
TEST(Monitor, TwoStepBlipIsNotAlerted) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 40, [](StepSummary &s) {
    if (s.rank == 7 && (s.step == 20 || s.step == 21))
      s = summary(7, s.step, 1.4);
  });
  EXPECT_TRUE(a.empty()) << a[0].text;
}

// A marginal straggler (1.45x: slow, not twice the bar) needs three steps.
TEST(Monitor, MarginalSlowdownNeedsThreeSteps) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 30, [](StepSummary &s) {
    if (s.rank == 3 && s.step >= 10)
      s = summary(3, s.step, 1.45);
  });
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "slow-rank");
  EXPECT_EQ(a[0].rank, 3);
  EXPECT_EQ(a[0].since, 10);
  EXPECT_EQ(a[0].step, 12);
}

// MPI ranks: CPU time compared across processes carries each process's
// placement (a healthy MPI rank measured 1.72x its peers' for a whole run,
// docs/mapp-scan.md): 1.6x there is not a straggler, 3x is; rank threads
// of one process are judged at the usual bar.
TEST(Monitor, ProcessesNeedTwiceTheirPeersCpuTime) {
  auto slowFrom10 = [](double f) {
    return [f](StepSummary &s) {
      if (s.rank == 3 && s.step >= 10)
        s = summary(3, s.step, f);
    };
  };
  MonitorOptions processes;
  processes.ranksAreProcesses = true;
  WindowDiagnoser mpi(kWorld, processes);
  auto a = feed(mpi, 30, slowFrom10(1.6));
  EXPECT_TRUE(a.empty()) << a[0].text;
  WindowDiagnoser threads(kWorld);
  a = feed(threads, 30, slowFrom10(1.6));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].rank, 3);
  WindowDiagnoser mpi3(kWorld, processes);
  a = feed(mpi3, 30, slowFrom10(3));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "slow-rank");
  EXPECT_EQ(a[0].rank, 3);
}

// A host with more ranks than CPUs (StepSummary::BusyHost, as mapp-scan's
// busy host): its ranks' CPU times carry the contention, so 1.45x there
// is said by no alert, 2x still is; the same 1.45x is alerted elsewhere.
TEST(Monitor, BusyHostRanksNeedTheBusyHostBar) {
  auto slowFrom10 = [](double f, bool busy) {
    return [f, busy](StepSummary &s) {
      if (s.rank == 3 && s.step >= 10)
        s = summary(3, s.step, f);
      if (busy)
        s.flags |= StepSummary::BusyHost;
    };
  };
  WindowDiagnoser busy(kWorld);
  auto a = feed(busy, 30, slowFrom10(1.45, true));
  EXPECT_TRUE(a.empty()) << a[0].text;
  WindowDiagnoser quiet(kWorld);
  a = feed(quiet, 30, slowFrom10(1.45, false));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].rank, 3);
  WindowDiagnoser busy2(kWorld);
  a = feed(busy2, 30, slowFrom10(2, true));
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "slow-rank");
  EXPECT_EQ(a[0].rank, 3);
}

TEST(Monitor, SlowRankAlertedThenRecovered) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 30, [](StepSummary &s) {
    if (s.rank == 5 && s.step >= 10 && s.step < 15)
      s = summary(5, s.step, 3);
  });
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].kind, "slow-rank");
  EXPECT_EQ(a[0].rank, 5);
  EXPECT_EQ(a[0].step, 11); // two steps 3x slow in a row
  EXPECT_EQ(a[0].since, 10);
  EXPECT_NEAR(a[0].ratio, 3, 0.1);
  EXPECT_EQ(a[0].cause, "compute");
  EXPECT_EQ(a[1].kind, "recovered");
  EXPECT_EQ(a[1].of, "slow-rank");
  EXPECT_EQ(a[1].step, 16);
}

TEST(Monitor, ThrottledGpuNamedAsCause) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 20, [](StepSummary &s) {
    s.flags |= StepSummary::HasNvml;
    s.smClockMhz = 1980;
    s.powerW = 500;
    s.temperatureC = 60;
    if (s.rank == 2 && s.step >= 5) {
      s = summary(2, s.step, 1.8);
      s.flags |= StepSummary::HasNvml;
      s.smClockMhz = 1100;
      s.powerW = 700;
      s.temperatureC = 90;
      s.throttleReasons = 0x40; // HW thermal slowdown
    }
  });
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "slow-rank");
  EXPECT_EQ(a[0].rank, 2);
  EXPECT_EQ(a[0].cause, "clock-throttled");
  EXPECT_NE(a[0].text.find("hw-thermal"), std::string::npos) << a[0].text;
  std::string j = alertJson(a[0], 7);
  EXPECT_NE(j.find("\"sm_clock_mhz\":1100"), std::string::npos) << j;
  EXPECT_NE(j.find("\"at_step\":7"), std::string::npos) << j;
}

TEST(Monitor, SlowLinkNamedWithDirection) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 20, [](StepSummary &s) {
    if (s.rank == 6 && s.step >= 8) // 2 -> 6 carries 5 ms more
      s.recvFrom[0].minWireNs = s.recvFrom[0].minWireLoNs = 5e6;
  });
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].kind, "slow-link");
  EXPECT_EQ(a[0].src, 2);
  EXPECT_EQ(a[0].dst, 6);
  EXPECT_EQ(a[0].step, 9);
}

// Over MPI a receiver learns of a landing at its next poll: one off its
// core for 12 ms reads its link's fastest transfer as 12 ms (an upper bound;
// its first poll found the payload, so nothing bounds it from below).
// Pooled into the noise bar, such late polls of the peers lifted the bar
// over a 5 ms delay that every transfer of the link provably waited for
// (test_monitor.py's MPI case on a busy host): the link is still named, as
// soon as on an idle host, not "recovered" while the delay lasts, and its
// recovery still seen though the late polls go on.
TEST(Monitor, LateReceiversDoNotHideASlowLink) {
  WindowDiagnoser d(kWorld);
  auto a = feed(d, 24, [](StepSummary &s) {
    PeerStats &p = s.recvFrom[0];
    p.stamped = p.count; // MPI: stamped, the landing bounded from above
    p.stampedLo = 0;     // ... only
    // Each step one receiver of each direction polled 12 ms late.
    if (s.rank % 4 == s.step % 4)
      p.minWireNs = 12e6;
    // In steps 9 and 12 every stage-1 receiver polled late: the step's
    // median rises past the delayed link, which says nothing of it (it
    // neither delays the alert nor counts towards a recovery).
    if ((s.step == 9 || s.step == 12) && s.rank >= 4)
      p.minWireNs = 12e6;
    if (s.rank == 6 && s.step >= 8 && s.step < 14) { // 2 -> 6: 5 ms delay
      p.minWireNs = p.minWireLoNs = 5e6;
      p.stampedLo = p.count;
    }
  });
  ASSERT_EQ(a.size(), 2u) << (a.empty() ? "no alert" : a[0].text);
  EXPECT_EQ(a[0].kind, "slow-link");
  EXPECT_EQ(a[0].src, 2);
  EXPECT_EQ(a[0].dst, 6);
  EXPECT_EQ(a[0].step, 9);
  EXPECT_EQ(a[1].kind, "recovered");
  EXPECT_EQ(a[1].src, 2);
  EXPECT_GE(a[1].step, 14); // not while the delay lasts
  EXPECT_LE(a[1].step, 14 + 3);
}

// Ranks on different hosts read different clocks: a stamped wire time
// (arrived on the receiver's clock - sent on the sender's) carries their
// offset, here tens of ms against 20 us transfers. The step's anchor
// collective, which both ends left together, gives the offset back.
TEST(Monitor, StampedWireAcrossHostsUsesTheAnchor) {
  const double offMs[kWorld] = {0, 31, 7, 45, 13, 2, 29, 50};
  auto crossHost = [&](StepSummary &s, bool sharedAnchor) {
    s.host = 100 + s.rank; // every rank its own host and clock
    PeerStats &p = s.recvFrom[0];
    p.stamped = p.stampedLo = p.count;
    p.minWireNs += (offMs[s.rank] - offMs[p.peer]) * 1e6;
    p.minWireLoNs = p.minWireNs;
    s.anchorKey = sharedAnchor ? 42 : 42 + s.rank / 4;
    s.anchorEndNs = 5e9 + offMs[s.rank] * 1e6;
  };
  {
    WindowDiagnoser d(kWorld);
    auto a = feed(d, 20, [&](StepSummary &s) {
      if (s.rank == 6 && s.step >= 8) // 2 -> 6 carries 5 ms more
        s.recvFrom[0].minWireNs = s.recvFrom[0].minWireLoNs = 5e6;
      crossHost(s, true);
    });
    ASSERT_EQ(a.size(), 1u) << a[0].text;
    EXPECT_EQ(a[0].kind, "slow-link");
    EXPECT_EQ(a[0].src, 2);
    EXPECT_EQ(a[0].dst, 6);
    EXPECT_EQ(a[0].step, 9);
  }
  { // no collective both ends left together: the offset is unknown and
    // such links are not judged (their raw stamps raise false alerts)
    WindowDiagnoser d(kWorld);
    auto a = feed(d, 20, [&](StepSummary &s) { crossHost(s, false); });
    EXPECT_TRUE(a.empty()) << a[0].text;
  }
}

// The summarizer keeps stamped samples only once it has one (a span says
// nothing next to them), keeps their sign, and anchors the step at the
// collective that ended last.
TEST(Monitor, SummarizerStampsAndAnchor) {
  Summarizer a, b;
  for (Summarizer *z : {&a, &b})
    z->setGroupKind(0, "world", {0, 1});
  auto recv = [](uint64_t b, uint64_t e, uint64_t sent, uint64_t arrived) {
    SummaryEvent ev;
    ev.step = 0;
    ev.cat = mapp::trace::Category::Comm;
    ev.op = mapp::trace::Op::Recv;
    ev.peer = 1;
    ev.bytes = 8;
    ev.beginNs = b;
    ev.endNs = e;
    ev.sentNs = sent;
    ev.arrivedNs = arrived;
    return ev;
  };
  auto coll = [](int64_t seq, uint64_t end) {
    SummaryEvent ev;
    ev.step = 0;
    ev.cat = mapp::trace::Category::Comm;
    ev.op = mapp::trace::Op::AllReduce;
    ev.group = 0;
    ev.seq = seq;
    ev.beginNs = end - 10;
    ev.endNs = end;
    return ev;
  };
  a.add(recv(1000, 2000, 0, 0));       // a span of 1000 ns
  a.add(recv(3000, 3100, 9000, 8500)); // stamped: -500 (clocks differ)
  a.add(recv(4000, 4001, 0, 0));       // a 1 ns span: not mixed in
  a.add(recv(5000, 5200, 9000, 9300)); // stamped: 300
  a.add(coll(7, 6000));
  a.add(coll(3, 2500)); // earlier: not the anchor
  b.add(coll(7, 9000));
  StepSummary sa = a.take(0), sb = b.take(0);
  ASSERT_EQ(sa.recvPeers, 1);
  EXPECT_EQ(sa.recvFrom[0].count, 4u);
  EXPECT_EQ(sa.recvFrom[0].stamped, 2u);
  EXPECT_DOUBLE_EQ(sa.recvFrom[0].minWireNs, -500);
  EXPECT_DOUBLE_EQ(sa.recvFrom[0].sumWireNs, -200);
  EXPECT_EQ(sa.recvFrom[0].stampedLo, 2u); // exact landings bound it too
  EXPECT_DOUBLE_EQ(sa.recvFrom[0].minWireLoNs, -500);
  EXPECT_TRUE(sa.recvFrom[0].hasWireLo());
  EXPECT_TRUE(sa.flags & StepSummary::HasWire);
  EXPECT_NE(sa.anchorKey, 0u);
  EXPECT_EQ(sa.anchorKey, sb.anchorKey);
  EXPECT_DOUBLE_EQ(sa.anchorEndNs, 6000);
  Summarizer d; // a polled landing the first poll found: no lower bound
  SummaryEvent polled = recv(1000, 1200, 900, 1150);
  polled.arrivalExact = false;
  d.add(polled);
  StepSummary sd = d.take(0);
  EXPECT_EQ(sd.recvFrom[0].stamped, 1u);
  EXPECT_FALSE(sd.recvFrom[0].hasWireLo());
  Summarizer c; // another group of the kind: another instance
  c.setGroupKind(0, "world", {0, 2});
  c.add(coll(7, 9000));
  EXPECT_NE(c.take(0).anchorKey, sa.anchorKey);
}

TEST(Monitor, SilentRankNamedOnceWithoutWaitingForIt) {
  WindowDiagnoser d(kWorld);
  std::vector<Alert> seen;
  for (int step = 0; step < 12; ++step) {
    for (int r = 0; r < kWorld; ++r)
      if (!(r == 3 && step >= 4))
        d.add(summary(r, step));
    for (Alert &a : d.poll())
      seen.push_back(a);
    if (step == 7) { // 3 steps behind: named by now
      ASSERT_EQ(seen.size(), 1u);
      EXPECT_EQ(seen[0].kind, "missing-summaries");
      EXPECT_EQ(seen[0].rank, 3);
      EXPECT_EQ(seen[0].step, 4);
    }
  }
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_TRUE(d.finish().empty());
  EXPECT_GE(d.nextStep(), 11); // the others' steps were diagnosed
}

TEST(Monitor, MemoryBoundedByWindowNotRunLength) {
  WindowDiagnoser d(kWorld);
  feed(d, 10, [](StepSummary &) {});
  size_t after10 = d.memoryBytes();
  WindowDiagnoser e(kWorld);
  feed(e, 500, [](StepSummary &) {});
  EXPECT_EQ(e.memoryBytes(), after10);
  EXPECT_LT(after10, size_t(kWorld) * 8 * (sizeof(StepSummary) + 64) + 4096);
}

TEST(Monitor, AlertLogRefusesUnwritablePath) {
  std::string err;
  EXPECT_EQ(AlertLog::open("/nonexistent-dir/a.jsonl", "t", &err), nullptr);
  EXPECT_NE(err.find("/nonexistent-dir/a.jsonl"), std::string::npos) << err;
}

} // namespace

// Exposed communication in a step summary (mapp/monitor/Exposure.h), known
// in closed form: rank 5 of tp2 pp2 dp2 (stage 1). Host thread: recv from
// stage 0 (forward) 0-100, compute 100-400, tp all-reduce 400-450, an
// `optimizer` region 450-700 around a world all-reduce 450-500 and adamw
// 500-700, send to stage 0 (backward) 700-720. Stream "comm": a dp
// all-reduce 300-600, beside compute 300-400 and adamw 500-600.
TEST(Monitor, SummaryExposedCommunicationPerClass) {
  using mapp::trace::Category;
  using mapp::trace::Op;
  Summarizer sum;
  sum.setIdentity(5, 1, 0, 1, "h");
  sum.setLayout(2, 2, 2);
  sum.setGroupKind(0, "tp");
  sum.setGroupKind(1, "dp");
  sum.setGroupKind(2, "world");
  auto ev = [&](Category cat, Op op, int group, int peer, uint64_t b,
                uint64_t e, const char *stream = "") {
    SummaryEvent x;
    x.name = "x";
    x.step = 3;
    x.cat = cat;
    x.op = op;
    x.group = group;
    x.peer = peer;
    x.beginNs = 1000 * b;
    x.endNs = 1000 * e;
    x.track = trackOf(stream);
    sum.add(x);
  };
  ev(Category::Comm, Op::Recv, -1, 1, 0, 100);
  ev(Category::Compute, Op::None, -1, -1, 100, 400);
  ev(Category::Comm, Op::AllReduce, 0, -1, 400, 450);
  ev(Category::Optimizer, Op::None, -1, -1, 450, 700); // region
  ev(Category::Comm, Op::AllReduce, 2, -1, 450, 500);
  ev(Category::Optimizer, Op::None, -1, -1, 500, 700);
  ev(Category::Comm, Op::Send, -1, 1, 700, 720);
  ev(Category::Comm, Op::AllReduce, 1, -1, 300, 600, "comm");
  StepSummary s = sum.take(3);
  EXPECT_FLOAT_EQ(s.exposedNs[CommP2pForward], 100e3);
  EXPECT_FLOAT_EQ(s.exposedNs[CommTp], 50e3);
  // The region is not compute: the all-reduce inside it is exposed.
  EXPECT_FLOAT_EQ(s.exposedNs[CommOther], 50e3);
  EXPECT_FLOAT_EQ(s.exposedNs[CommP2pBackward], 20e3);
  // 300 us beside compute 300-400 and adamw 500-600: 100 us exposed.
  EXPECT_FLOAT_EQ(s.commClassNs[CommDp], 300e3);
  EXPECT_FLOAT_EQ(s.exposedNs[CommDp], 100e3);
  EXPECT_FLOAT_EQ(s.spanNs, 720e3);
  EXPECT_NEAR(s.totalExposedNs(), 320e3, 1);

  // Without the layout the transfers' direction is unknown.
  Summarizer plain;
  plain.setIdentity(5, 1, 0, 1, "h");
  SummaryEvent x;
  x.name = "recv";
  x.step = 0;
  x.cat = Category::Comm;
  x.op = Op::Recv;
  x.peer = 1;
  x.endNs = 5000;
  plain.add(x);
  EXPECT_FLOAT_EQ(plain.take(0).exposedNs[CommP2p], 5000);
}

// The window sums what the summaries say; the line names the most exposed
// rank.
TEST(Monitor, ExposureTotalsOverTheWindow) {
  WindowDiagnoser d(kWorld);
  feed(d, 4, [](StepSummary &s) {
    s.spanNs = 10e6;
    s.commClassNs[CommTp] = 2e6;
    s.exposedNs[CommTp] = s.rank == 6 ? 2e6 : 1e6;
  });
  const ExposureTotals &t = d.exposure();
  EXPECT_EQ(t.steps, 4);
  EXPECT_EQ(t.summaries, 4 * kWorld);
  EXPECT_DOUBLE_EQ(t.exposedNs[CommTp], 4 * (7 * 1e6 + 2e6));
  std::string line = exposureText(t);
  EXPECT_NE(line.find("exposed communication 1.125 ms per rank and step "
                      "(11.2% of its step; communication 2.000 ms): tp 1.125"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("most exposed: rank 6, 2.000 ms"), std::string::npos)
      << line;
}

// A summary of another layout version is refused, not misread.
TEST(Monitor, SummaryOfAnotherVersionRefused) {
  StepSummary s = summary(0, 0);
  s.magic = 0x4d534d31; // "MSM1", the layout before exposure
  std::string path = ::testing::TempDir() + "/old.summaries";
  std::string err;
  ASSERT_TRUE(writeSummaries(path, {s}, &err)) << err;
  std::vector<StepSummary> back;
  EXPECT_FALSE(readSummaries(path, back, &err));
  EXPECT_NE(err.find("bad magic"), std::string::npos) << err;
  WindowDiagnoser d(kWorld);
  EXPECT_FALSE(d.add(s));
}

// The diagnosis core both mapp-scan and the live monitor use, against
// closed forms.
TEST(Monitor, DiagnosisCoreStatisticsAndClasses) {
  using namespace mapp::monitor;
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({}), 0);
  EXPECT_DOUBLE_EQ(percentile({10, 20, 30, 40, 50}, 0.75), 40);
  // Two peers: the faster is the reference, unless symmetric (the mean).
  EXPECT_DOUBLE_EQ(peerReference({3, 1}), 1);
  EXPECT_DOUBLE_EQ(peerReference({3, 1}, true), 2);
  EXPECT_DOUBLE_EQ(peerReference({5, 1, 2}), 2);
  // |x - 2| = {1, 0, 0, 8, 1}: MAD 1.
  EXPECT_DOUBLE_EQ(robustSpread({1, 2, 2, 10, 3}, 0.01), 1.4826);
  EXPECT_DOUBLE_EQ(robustSpread({}, 0.01), 0.01);
  EXPECT_DOUBLE_EQ(linkSlowBar(100, 0.5, 10, 0), 200);
  EXPECT_DOUBLE_EQ(linkSlowBar(100, 0.5, 50, 0), 250);
  EXPECT_DOUBLE_EQ(linkSlowBar(100, 0.5, 10, 500), 600);
  EXPECT_DOUBLE_EQ(linkConfidence(100, 200, 60, 10, 0.25), 1);
  EXPECT_DOUBLE_EQ(linkConfidence(100, 125, 30, 10, 0.25), 0.4 * 0.5);
  EXPECT_DOUBLE_EQ(rankSlowness(1.5, 1), 0.25);
  EXPECT_DOUBLE_EQ(rankSlowness(4, 1), 1);
  EXPECT_EQ(pipelineDirection(1, 2, 4), 1);
  EXPECT_EQ(pipelineDirection(2, 1, 4), -1);
  EXPECT_EQ(pipelineDirection(3, 0, 4), 1); // interleaved wrap-around
  EXPECT_EQ(pipelineDirection(3, 0, 0), 0); // stage count unknown
  // Three forward links of one size share a class; the lone backward one
  // falls back to (host, size), then the other size to the host alone.
  LinkClasses c;
  c.add(true, 64, 1);
  c.add(true, 64, 1);
  c.add(true, 64, 1);
  c.add(true, 64, -1);
  c.add(true, 8, 1);
  c.add(false, 64, 1);
  EXPECT_EQ(c.classOf(0), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(c.classOf(3), (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(c.classOf(4), (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(c.classOf(5), (std::vector<size_t>{5}));
}

//===- CommTest.cpp - the thread-world communicator and multi-rank runs ---===//
#include "CommChecks.h"
#include "TestPlans.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Faults.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

/// Runs fn(comm) on every rank of a thread world; returns each rank's error
/// ("" = none). A failing rank aborts the world, as mapp-run does.
std::vector<std::string> onWorld(int n, const Layout &l, double timeout,
                                 const std::function<void(Communicator &)> &fn) {
  std::unique_ptr<LocalWorld> w = createLocalWorld(n);
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Communicator> c = w->connect(r);
      c->setLayout(l);
      c->setTimeout(timeout);
      try {
        fn(*c);
      } catch (const std::exception &e) {
        err[r] = e.what();
        w->abort(r, e.what());
      }
    });
  for (auto &t : ts)
    t.join();
  return err;
}

Plan parse(const std::vector<uint8_t> &b) {
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

} // namespace

TEST(Layout, MegatronOrder) {
  Layout l{2, 2, 2};
  EXPECT_EQ(l.rankOf(1, 0, 1), 5);
  EXPECT_EQ(l.members(Group::TP, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.members(Group::DP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.members(Group::PP, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.members(Group::World, 5).size(), 8u);
}

// Context parallelism inside dp (docs/context-parallel.md): tp2 x dp4
// (dp = 2 data shards x cp 2), rank = t + 2·d: the cp group of d is the
// two consecutive dp indices d - d%2, d - d%2 + 1 with the same tp index.
TEST(Layout, ContextParallelGroupInsideDp) {
  Layout l{2, 4, 1, 0, 2};
  EXPECT_EQ(l.members(Group::CP, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.members(Group::CP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.members(Group::CP, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(l.members(Group::DP, 5), (std::vector<int>{1, 3, 5, 7}));
  // Without cp the group is the rank alone.
  Layout none{2, 4, 1};
  EXPECT_EQ(none.members(Group::CP, 5), (std::vector<int>{5}));
  Group g;
  ASSERT_TRUE(parseGroup("cp", g));
  EXPECT_EQ(g, Group::CP);
  EXPECT_STREQ(groupName(Group::CP), "cp");
}

class LocalCommChecks : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(LocalCommChecks, ClosedForm) {
  auto [tp, dp, pp] = GetParam();
  Layout l{tp, dp, pp};
  auto err = onWorld(l.world(), l, 30, [](Communicator &c) { runCommChecks(c); });
  for (int r = 0; r < l.world(); ++r)
    EXPECT_EQ(err[r], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Layouts, LocalCommChecks,
                         ::testing::Values(std::make_tuple(1, 1, 1),
                                           std::make_tuple(2, 1, 1),
                                           std::make_tuple(2, 2, 1),
                                           std::make_tuple(1, 3, 1),
                                           std::make_tuple(2, 2, 2)));

TEST(LocalComm, AllReduceIsBitIdenticalOnEveryMember) {
  const int n = 4, count = 1001;
  std::vector<std::vector<float>> out(n);
  onWorld(n, Layout{n, 1, 1}, 30, [&](Communicator &c) {
    std::vector<float> b(count);
    for (int i = 0; i < count; ++i)
      b[i] = std::sin(0.37f * i + c.rank()) * 1e3f + 1e-3f * c.rank();
    c.allReduce(b.data(), count, ReduceOp::Sum, Group::TP);
    out[c.rank()] = b;
  });
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(std::memcmp(out[0].data(), out[r].data(), count * 4), 0);
}

TEST(LocalComm, MissingRankTimesOutNamingIt) {
  auto start = std::chrono::steady_clock::now();
  auto err = onWorld(3, Layout{3, 1, 1}, 0.3, [](Communicator &c) {
    if (c.rank() == 2)
      return; // never joins
    float x = 1;
    c.allReduce(&x, 1, ReduceOp::Sum, Group::TP);
  });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           start)
                 .count();
  EXPECT_LT(s, 5);
  bool named = err[0].find("rank(s) 2") != std::string::npos ||
               err[1].find("rank(s) 2") != std::string::npos;
  EXPECT_TRUE(named) << err[0] << " | " << err[1];
}

TEST(LocalComm, FailedRankWakesItsPeers) {
  auto err = onWorld(2, Layout{2, 1, 1}, 60, [](Communicator &c) {
    if (c.rank() == 1)
      fail("injected failure");
    float x;
    c.recv(&x, 4, 1, 0);
  });
  EXPECT_NE(err[0].find("rank 1 failed (injected failure)"), std::string::npos)
      << err[0];
}

TEST(NcclPlacement, OneGpuPerRank) {
  EXPECT_EQ(ncclDeviceOf(0, 2, 8), 0);
  EXPECT_EQ(ncclDeviceOf(3, 4, 4), 3);
  auto message = [](int rank, int world, int devices) {
    try {
      ncclDeviceOf(rank, world, devices);
    } catch (const Error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string more = message(0, 4, 1);
  EXPECT_NE(more.find("the plan has 4 ranks but only 1 GPU(s) are visible"),
            std::string::npos) << more;
  EXPECT_NE(more.find("use --comm=local"), std::string::npos) << more;
  std::string none = message(0, 1, 0);
  EXPECT_NE(none.find("no CUDA device is visible"), std::string::npos) << none;
  std::string bad = message(5, 2, 2);
  EXPECT_NE(bad.find("no rank 5 in a world of 2"), std::string::npos) << bad;
}

// Without NCCL the world is refused by name; with it, by the missing GPUs
// (none on the development machine, one on the lent H200).
TEST(NcclPlacement, WorldWithoutNcclOrGpuIsAnError) {
  std::string msg;
  try {
    createNcclWorld(2);
  } catch (const Error &e) {
    msg = e.what();
  }
  if (msg.empty())
    GTEST_SKIP() << "two GPUs are visible: the world was created";
  if (haveNcclComm())
    EXPECT_TRUE(msg.find("no CUDA device is visible") != std::string::npos ||
                msg.find("use --comm=local") != std::string::npos)
        << msg;
  else
    EXPECT_NE(msg.find("--comm=nccl is not built into this runtime"),
              std::string::npos) << msg;
}

TEST(Comm, ThreadWorldsShareTheAddressSpace) {
  EXPECT_TRUE(createLocalComm()->sharesAddressSpace());
  EXPECT_TRUE(createLocalWorld(2)->connect(1)->sharesAddressSpace());
  EXPECT_EQ(createLocalComm()->deviceImpl(), nullptr);
}

TEST(LocalComm, MismatchedSizesAreAnError) {
  auto err = onWorld(2, Layout{2, 1, 1}, 10, [](Communicator &c) {
    std::vector<float> b(3 + c.rank());
    c.allReduce(b.data(), static_cast<int64_t>(b.size()), ReduceOp::Sum,
                Group::TP);
  });
  EXPECT_NE((err[0] + err[1]).find("mismatched plan"), std::string::npos);
  float x = 0;
  auto err2 = onWorld(2, Layout{2, 1, 1}, 10, [&](Communicator &c) {
    if (c.rank() == 0)
      c.send(&x, 4, 1, 3);
    else {
      double d;
      c.recv(&d, 8, 0, 3);
    }
  });
  EXPECT_NE(err2[1].find("4 bytes, expected 8"), std::string::npos) << err2[1];
}

TEST(Faults, ParseInjection) {
  Injection a = parseInjection("slow-compute:rank=3,factor=2.5");
  EXPECT_EQ(a.kind, Injection::SlowCompute);
  EXPECT_EQ(a.rank, 3);
  EXPECT_DOUBLE_EQ(a.factor, 2.5);
  Injection b = parseInjection("link-delay:src=1,dst=2,us=50");
  EXPECT_EQ(b.src, 1);
  EXPECT_EQ(b.dst, 2);
  EXPECT_DOUBLE_EQ(b.us, 50);
  Injection c = parseInjection("link-bandwidth:src=0,dst=4,gbps=1.5");
  EXPECT_DOUBLE_EQ(c.gbps, 1.5);
  EXPECT_DOUBLE_EQ(slowComputeFactor({a, a, b}, 3, 0), 6.25);
  Injection w = parseInjection(
      "slow-compute:rank=1,factor=3,from-step=2,to-step=4");
  EXPECT_DOUBLE_EQ(slowComputeFactor({w}, 1, 1), 1);
  EXPECT_DOUBLE_EQ(slowComputeFactor({w}, 1, 2), 3);
  EXPECT_DOUBLE_EQ(slowComputeFactor({w}, 1, 3), 3);
  EXPECT_DOUBLE_EQ(slowComputeFactor({w}, 1, 4), 1);
  Injection d = parseInjection("link-delay:src=0,dst=1,us=5,from-step=3");
  EXPECT_EQ(d.fromStep, 3);
  EXPECT_EQ(d.toStep, -1);
  EXPECT_THROW(parseInjection("link-delay:src=0,dst=1,us=5,from-step=3,"
                              "to-step=3"),
               Error);
  EXPECT_THROW(parseInjection("link-delay:src=1,dst=1,us=5"), Error);
  EXPECT_THROW(parseInjection("link-delay:src=0,dst=1,us=5,from-step=-1"),
               Error);
  EXPECT_THROW(parseInjection("slow-disk:rank=1"), Error);
  EXPECT_THROW(parseInjection("slow-compute:rank=1"), Error);
  EXPECT_THROW(parseInjection("slow-compute:rank=x,factor=2"), Error);
  EXPECT_THROW(parseInjection("link-delay:src=1,dst=2,us=5,extra=1"), Error);
  // stop: once, at from-step; it has no end (SIGCONT ends it).
  Injection s = parseInjection("stop:rank=2,from-step=5");
  EXPECT_EQ(s.kind, Injection::Stop);
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.fromStep, 5);
  EXPECT_THROW(parseInjection("stop:rank=2,from-step=5,to-step=6"), Error);
  EXPECT_THROW(parseInjection("stop:from-step=5"), Error);
}

// A link delay acts on the transfer: the sender returns at once, the
// receiver gets the message no earlier than U after it was sent; the other
// direction is untouched; outside its step window the link is fast.
TEST(Faults, LinkDelayActsOnTheTransfer) {
  std::unique_ptr<LocalWorld> w = createLocalWorld(2);
  std::vector<Injection> inj = {
      parseInjection("link-delay:src=0,dst=1,us=60000,from-step=1,to-step=2")};
  auto c0 = withLinkFaults(w->connect(0), inj);
  auto c1 = withLinkFaults(w->connect(1), inj);
  using C = std::chrono::steady_clock;
  auto secs = [](C::time_point a) {
    return std::chrono::duration<double>(C::now() - a).count();
  };
  float x = 1, y = 0;
  for (int64_t step : {0, 1, 2}) {
    c0->setStep(step);
    c1->setStep(step);
    auto t0 = C::now();
    c0->send(&x, 4, 1, step);
    double sendS = secs(t0);
    c1->recv(&y, 4, 0, step);
    double recvS = secs(t0);
    EXPECT_LT(sendS, 0.03) << "the sender must not wait (step " << step << ")";
    if (step == 1)
      EXPECT_GE(recvS, 0.06) << "delivered before the delay passed";
    else
      EXPECT_LT(recvS, 0.03) << "fault active outside its window, step "
                             << step;
  }
  // The reverse direction is a clean link, and a posted irecv completes
  // only after the delay too.
  c0->setStep(1);
  c1->setStep(1);
  auto t0 = C::now();
  c1->send(&x, 4, 0, 9);
  c0->recv(&y, 4, 1, 9);
  EXPECT_LT(secs(t0), 0.03);
  P2PHandle r = c1->irecv(&y, 4, 0, 10);
  t0 = C::now();
  c0->send(&x, 4, 1, 10);
  EXPECT_FALSE(c1->test(*r));
  c1->wait(*r);
  EXPECT_GE(secs(t0), 0.06);
  EXPECT_GE(r->completedNs - r->sentNs, 60000000u);
}

// A receiver over MPI learns of a landing at its next poll; where its first
// poll found the payload the landing is bounded from above only (pendingNs
// 0). The link fault wrapped around such a receive marked every landing
// exact (pendingNs = completedNs) even with no fault active, so a receiver
// that noticed 10 ms late read as a 10 ms wire in the clean steps of
// test_monitor.py's MPI case. Its bounds stay the inner's outside the fault;
// inside it the landing is the fault's release, exact when that came after
// the inner landing was noticed, else no earlier than the release.
TEST(Faults, LinkFaultKeepsTheInnerLandingBounds) {
  /// Receives from rank 0 that landed `noticedAfterNs` after their send,
  /// found by the first poll (MPI's inexact landing).
  class LateNoticeComm final : public Communicator {
  public:
    uint64_t noticedAfterNs = 0;
    std::string name() const override { return "late-notice"; }
    int rank() const override { return 1; }
    int worldSize() const override { return 2; }
    void allReduce(float *, int64_t, ReduceOp, const CommGroup &) override {}
    void allReduce(double *, int64_t, ReduceOp, const CommGroup &) override {}
    void allGather(const float *, float *, int64_t,
                   const CommGroup &) override {}
    void reduceScatter(const float *, float *, int64_t, ReduceOp,
                       const CommGroup &) override {}
    void allToAll(const void *, void *, size_t, const CommGroup &) override {}
    void send(const void *, size_t, int, int64_t) override {}
    void recv(void *, size_t, int, int64_t) override {}
    void barrier() override {}
    P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override {
      auto r = std::make_shared<P2PRequest>();
      r->isRecv = true;
      r->buf = buf;
      r->bytes = bytes;
      r->peer = peer;
      r->tag = tag;
      return r;
    }
    bool test(P2PRequest &r) override {
      r.completedNs = p2pNowNs();
      r.sentNs = r.completedNs - noticedAfterNs;
      r.pendingNs = 0; // the first poll found it
      r.done = true;
      return true;
    }
  };
  auto inner = std::make_unique<LateNoticeComm>();
  LateNoticeComm &late = *inner;
  std::vector<Injection> inj = {
      parseInjection("link-delay:src=0,dst=1,us=5000,from-step=1,to-step=2")};
  std::unique_ptr<Communicator> c = withLinkFaults(std::move(inner), inj);
  float y = 0;
  auto recvAt = [&](int64_t step, uint64_t noticedAfterNs) {
    c->setStep(step);
    late.noticedAfterNs = noticedAfterNs;
    P2PHandle r = c->irecv(&y, 4, 0, 7);
    c->wait(*r);
    return RecvStamps::of(*r);
  };
  // No fault active: as inexact as the inner landing.
  RecvStamps clean = recvAt(0, 10000000);
  EXPECT_EQ(clean.pendingNs, 0u);
  EXPECT_FALSE(clean.exact());
  EXPECT_EQ(clean.arrivedNs - clean.sentNs, 10000000u);
  // Held 5 ms past a landing noticed after 1 ms: the release, exactly.
  RecvStamps held = recvAt(1, 1000000);
  EXPECT_TRUE(held.exact());
  EXPECT_EQ(held.arrivedNs - held.sentNs, 5000000u);
  // Noticed 10 ms late, after the release: at least the 5 ms delay.
  RecvStamps lateHeld = recvAt(1, 10000000);
  EXPECT_FALSE(lateHeld.exact());
  EXPECT_EQ(lateHeld.pendingNs - lateHeld.sentNs, 5000000u);
  EXPECT_EQ(lateHeld.arrivedNs - lateHeld.sentNs, 10000000u);
}

// Posted receives: matched in posting order, into the caller's buffer, any
// dtype (bytes), waitAny returns the one that completed.
TEST(Comm, AsyncPostedReceives) {
  auto err = onWorld(2, Layout{2, 1, 1}, 30, [&](Communicator &c) {
    if (c.rank() == 0) {
      int32_t a = 7;
      double b = 2.5;
      c.barrier(); // rank 1 has posted
      c.isend(&b, 8, 1, 2);
      c.isend(&a, 4, 1, 1);
      c.send(&a, 4, 1, 1);
    } else {
      int32_t a1 = 0, a2 = 0;
      double b = 0;
      P2PHandle ra = c.irecv(&a1, 4, 0, 1), rb = c.irecv(&b, 8, 0, 2),
                ra2 = c.irecv(&a2, 4, 0, 1);
      c.barrier();
      std::vector<P2PRequest *> all = {ra.get(), rb.get(), ra2.get()};
      int done = 0;
      while (done < 3) {
        int i = c.waitAny(all);
        if (i < 0)
          fail("waitAny without deadline returned -1");
        all.erase(all.begin() + i);
        ++done;
      }
      if (a1 != 7 || a2 != 7 || b != 2.5)
        fail("payload wrong");
      P2PHandle never = c.irecv(&a1, 4, 0, 99);
      if (c.waitAny({never.get()}, p2pNowNs() + 1000000) != -1)
        fail("deadline not honoured");
      c.cancel(*never);
    }
  });
  for (auto &s : err)
    EXPECT_EQ(s, "");
}

// Sharded parameters: init and load slice the full tensor, gatherParams
// reassembles it on rank 0 — equal to a single-rank run's parameters.
TEST(MultiRank, ShardedParamsSliceAndGather) {
  MlpOptions o;
  o.vocab = 11;
  o.hidden = 4;
  o.ffn = 6;
  Plan single = parse(parallelMlpPlan(o, {}).build());
  ParallelOptions po;
  po.tp = 2;
  po.pp = 2;
  Plan multi = parse(parallelMlpPlan(o, po).build());
  auto be = createCpuBackend(1);
  auto solo = createLocalComm();
  Executor ref(single, *be, *solo);
  ref.initParams(7);
  Safetensors want = ref.saveParams();

  std::vector<Safetensors> got(4), gotLoaded(4);
  auto err = onWorld(4, Layout{2, 1, 2}, 30, [&](Communicator &c) {
    auto b = createCpuBackend(1);
    Executor e(multi, *b, c);
    e.initParams(7);
    got[c.rank()] = e.gatherParams();
    e.initParams(99);
    e.loadParams(want, "want");
    gotLoaded[c.rank()] = e.gatherParams();
  });
  for (auto &s : err)
    ASSERT_EQ(s, "");
  for (const Safetensors *g : {&got[0], &gotLoaded[0]}) {
    ASSERT_EQ(g->tensors.size(), want.tensors.size());
    for (auto &[name, t] : want.tensors) {
      ASSERT_TRUE(g->tensors.count(name)) << name;
      EXPECT_EQ(g->tensors.at(name).shape, t.shape) << name;
      EXPECT_EQ(g->tensors.at(name).data, t.data) << name;
    }
  }
  EXPECT_TRUE(got[1].tensors.empty());
}

TEST(MultiRank, WorldSizeMismatchIsAnError) {
  MlpOptions o;
  ParallelOptions po;
  po.dp = 2;
  Plan p = parse(parallelMlpPlan(o, po).build());
  auto be = createCpuBackend(1);
  auto solo = createLocalComm();
  try {
    Executor e(p, *be, *solo);
    FAIL() << "no error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("world_size 2"), std::string::npos)
        << e.what();
  }
}

namespace {
/// Runs fn on every rank of a thread world without aborting it on an
/// error: each rank must fail (or not) on its own, so a check that only
/// some members notice would show as a timeout on the others.
std::vector<std::string> onWorldNoAbort(int n, double timeout,
                                        const std::function<void(Communicator &)> &fn) {
  std::unique_ptr<LocalWorld> w = createLocalWorld(n);
  std::vector<std::string> err(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Communicator> c = w->connect(r);
      c->setLayout(Layout{n, 1, 1});
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
} // namespace

// Rank 1 sends rank 2 three floats, rank 2 expects two: every member, also
// 0 and 3 that are not in the pair, fails at once with the same message
// naming the pair (the 30 s timeout would show as a slow test and a
// "timed out" message).
TEST(AllToAllv, DisagreeingCountsFailOnEveryMember) {
  auto start = std::chrono::steady_clock::now();
  auto err = onWorldNoAbort(4, 30, [](Communicator &c) {
    CommGroup g = c.group(Group::TP);
    std::vector<uint64_t> sb(4, 8), rb(4, 8);
    if (c.rank() == 1)
      sb[2] = 12;
    std::vector<float> in(8), out(8);
    c.allToAllv(in.data(), sb, out.data(), rb, g);
  });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           start)
                 .count();
  EXPECT_LT(s, 10);
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(err[r].find("rank 1 sends 12 bytes to rank 2, which expects 8"),
              std::string::npos)
        << "rank " << r << ": " << err[r];
    EXPECT_EQ(err[r], err[0]);
  }
}

TEST(AllToAllv, WrongNumberOfCountsIsAnError) {
  auto err = onWorldNoAbort(2, 5, [](Communicator &c) {
    std::vector<uint64_t> sb(3, 0), rb(2, 0);
    c.allToAllv(nullptr, sb, nullptr, rb, c.group(Group::TP));
  });
  EXPECT_NE(err[0].find("3 send and 2 receive counts for a group of 2"),
            std::string::npos)
      << err[0];
}

TEST(AllToAllv, DeadPeerTimesOutNamingIt) {
  auto start = std::chrono::steady_clock::now();
  auto err = onWorldNoAbort(3, 0.3, [](Communicator &c) {
    if (c.rank() == 2)
      return; // dead: never joins
    std::vector<uint64_t> sb(3, 4), rb(3, 4);
    std::vector<float> in(3), out(3);
    c.allToAllv(in.data(), sb, out.data(), rb, c.group(Group::TP));
  });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                           start)
                 .count();
  EXPECT_LT(s, 10);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(err[r].find("timed out"), std::string::npos) << err[r];
    EXPECT_NE(err[r].find("rank(s) 2"), std::string::npos) << err[r];
  }
}

// The default (padded allToAll) path, as FaultComm-wrapped and NCCL host
// communicators that do not override it would take, against the closed form.
TEST(AllToAllv, FaultWrappedCommMovesTheSameBytes) {
  auto err = onWorldNoAbort(3, 30, [](Communicator &inner) {
    CommGroup g = inner.group(Group::TP);
    int me = g.indexOf(inner.rank());
    std::vector<uint64_t> sb(3), rb(3);
    std::vector<float> in;
    for (int j = 0; j < 3; ++j) {
      sb[j] = 4 * (me + j);
      rb[j] = 4 * (j + me);
      for (int k = 0; k < me + j; ++k)
        in.push_back(100.f * me + j);
    }
    std::vector<float> out(3 * me + 3, -1);
    struct Base : Communicator { // only allToAll: exercises the default
      Communicator &c;
      explicit Base(Communicator &c) : c(c) {}
      std::string name() const override { return "base"; }
      int rank() const override { return c.rank(); }
      int worldSize() const override { return c.worldSize(); }
      void allReduce(float *b, int64_t n, ReduceOp o, const CommGroup &g) override { c.allReduce(b, n, o, g); }
      void allReduce(double *b, int64_t n, ReduceOp o, const CommGroup &g) override { c.allReduce(b, n, o, g); }
      void allGather(const float *i, float *o, int64_t n, const CommGroup &g) override { c.allGather(i, o, n, g); }
      void reduceScatter(const float *i, float *o, int64_t n, ReduceOp op, const CommGroup &g) override { c.reduceScatter(i, o, n, op, g); }
      void allToAll(const void *i, void *o, size_t b, const CommGroup &g) override { c.allToAll(i, o, b, g); }
      void send(const void *b, size_t n, int p, int64_t t) override { c.send(b, n, p, t); }
      void recv(void *b, size_t n, int p, int64_t t) override { c.recv(b, n, p, t); }
      void barrier() override { c.barrier(); }
    } base(inner);
    base.allToAllv(in.data(), sb, out.data(), rb, g);
    size_t at = 0;
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < i + me; ++k)
        if (out[at++] != 100.f * i + me)
          fail("default all_to_allv: wrong value from member ", i);
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(err[r], "") << "rank " << r;
}

TEST(ExpertDispatch, ExpertsNotDivisibleByTheGroupIsAnError) {
  auto err = onWorldNoAbort(2, 5, [](Communicator &c) {
    std::unique_ptr<Backend> be = createCpuBackend(1);
    std::vector<float> x(6, 1), counts = {1, 1, 1}, y(12);
    Tensor ti[2] = {{x.data(), TensorType{DType::F32, {3, 2}}},
                    {counts.data(), TensorType{DType::F32, {3}}}};
    Tensor to[1] = {{y.data(), TensorType{DType::F32, {6, 2}}}};
    KernelContext ctx;
    ctx.comm = &c;
    ctx.pool = &be->pool();
    Attrs at;
    at.setStr("group", "tp");
    be->lookup("ep_dispatch")({at, ti, 2, to, 1, ctx});
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(err[r].find("3 experts cannot be split evenly over 2 members"),
              std::string::npos)
        << err[r];
}

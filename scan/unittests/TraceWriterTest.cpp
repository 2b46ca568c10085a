//===- TraceWriterTest.cpp - MappTraceWriter round trip and concurrency ---===//

#include "mapp/trace/TraceWriter.h"
#include "mapp/scan/AllToAllLoad.h"
#include "mapp/scan/Trace.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <thread>

using namespace mapp;

static std::string tempDir() {
  char tmpl[] = "/tmp/mapp-trace-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(TraceWriter, RoundTripThroughReader) {
  std::string dir = tempDir();
  TraceHeader h;
  h.rank = 1;
  h.world = 2;
  h.tp = 1;
  h.tpSize = 2;
  std::string err;
  auto w = MappTraceWriter::open(dir, h, &err);
  ASSERT_TRUE(w) << err;
  int g = w->registerGroup("tp", {0, 1});
  TraceRecord r;
  r.setName("fwd.attn \"quoted\"");
  r.beginNs = 100;
  r.endNs = 250;
  r.step = 0;
  r.layer = 3;
  EXPECT_EQ(w->append(r), 0);
  TraceRecord c;
  c.setName("ar");
  c.cat = TraceCategory::Comm;
  c.op = TraceOp::AllReduce;
  c.group = g;
  c.beginNs = 300;
  c.endNs = 400;
  EXPECT_EQ(w->append(c), 1);
  EXPECT_EQ(w->append(c), 2);
  w->close();

  scan::RankTrace rt;
  ASSERT_TRUE(scan::readRankFile(dir + "/rank-1.trace.jsonl", {}, rt, &err))
      << err;
  EXPECT_EQ(rt.hdr.rank, 1);
  EXPECT_EQ(rt.hdr.tpSize, 2);
  ASSERT_EQ(rt.events.size(), 3u);
  EXPECT_EQ(rt.events[0].name, "fwd.attn \"quoted\"");
  EXPECT_EQ(rt.events[0].layer, 3);
  EXPECT_EQ(rt.events[1].seq, 0); // assigned per group at append
  EXPECT_EQ(rt.events[2].seq, 1);
  EXPECT_EQ(rt.groups.at(g).members, (std::vector<int>{0, 1}));
  EXPECT_TRUE(rt.hasFooter);
}

TEST(TraceWriter, ConcurrentAppendsKeepEveryEventOnce) {
  std::string dir = tempDir();
  TraceHeader h;
  std::string err;
  auto w = MappTraceWriter::open(dir, h, &err, 1 << 10);
  ASSERT_TRUE(w) << err;
  w->setBlockWhenFull(true);
  const int kThreads = 4, kEach = 5000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        TraceRecord r;
        r.setName("op");
        r.microbatch = t;
        r.step = i;
        r.beginNs = i;
        r.endNs = i + 1;
        w->append(r);
      }
    });
  for (auto &t : ts)
    t.join();
  w->flush();
  w->close();
  scan::RankTrace rt;
  ASSERT_TRUE(scan::readRankFile(dir + "/rank-0.trace.jsonl", {}, rt, &err))
      << err;
  ASSERT_EQ(rt.events.size(), size_t(kThreads * kEach));
  std::set<std::pair<int, int>> seen;
  std::set<int64_t> ids;
  for (const auto &e : rt.events) {
    seen.insert({e.mb, e.step});
    ids.insert(e.id);
  }
  EXPECT_EQ(seen.size(), size_t(kThreads * kEach));
  EXPECT_EQ(ids.size(), size_t(kThreads * kEach));
  EXPECT_EQ(rt.dropped, 0);
}

TEST(TraceWriter, FullRingDropsAndCounts) {
  std::string dir = tempDir();
  TraceHeader h;
  std::string err;
  auto w = MappTraceWriter::open(dir, h, &err, 64);
  ASSERT_TRUE(w) << err;
  TraceRecord r;
  r.setName("x");
  // The worker may drain concurrently, so only bound what can be dropped.
  for (int i = 0; i < 100000; ++i)
    w->append(r);
  w->close();
  scan::RankTrace rt;
  ASSERT_TRUE(scan::readRankFile(dir + "/rank-0.trace.jsonl", {}, rt, &err));
  EXPECT_EQ(rt.events.size() + rt.dropped, 100000u);
}

TEST(TraceWriter, UnwritableDirIsAnError) {
  TraceHeader h;
  std::string err;
  EXPECT_FALSE(MappTraceWriter::open("/proc/no/such", h, &err));
  EXPECT_NE(err.find("cannot create"), std::string::npos);
}

// ep_dispatch's bytes per peer: written beside the record, read back by
// the reader, summed per (rank, name) with max/mean over the peers. Peer 1
// receives 3x what peer 0 does: (300 + 300) / mean(200, 600) = 1.5.
TEST(TraceWriter, AllToAllBytesPerPeerRoundTrip) {
  std::string dir = tempDir();
  TraceHeader h;
  h.world = 2;
  h.dpSize = 2;
  std::string err;
  auto w = MappTraceWriter::open(dir, h, &err);
  ASSERT_TRUE(w) << err;
  int g = w->registerGroup("ep", {0, 1});
  for (int step = 0; step < 2; ++step) {
    TraceRecord c;
    c.setName("ep_dispatch");
    c.cat = TraceCategory::Comm;
    c.op = TraceOp::AllToAll;
    c.group = g;
    c.step = step;
    c.beginNs = 100 + 1000 * step;
    c.endNs = 200 + 1000 * step;
    c.peerBytes = w->storePeerBytes({40, 80}, {100, 300});
    w->append(c);
  }
  w->close();
  scan::Trace t;
  t.world = 1;
  t.ranks.resize(1);
  ASSERT_TRUE(scan::readRankFile(dir + "/rank-0.trace.jsonl", {}, t.ranks[0],
                                 &err))
      << err;
  ASSERT_EQ(t.ranks[0].events.size(), 2u);
  EXPECT_EQ(t.ranks[0].events[0].recvBytes, (std::vector<uint64_t>{100, 300}));
  std::vector<scan::AllToAllLoad> l = scan::allToAllLoads(t);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].name, "ep_dispatch");
  EXPECT_EQ(l[0].events, 2);
  EXPECT_EQ(l[0].members, (std::vector<int>{0, 1}));
  EXPECT_EQ(l[0].sendBytes, (std::vector<uint64_t>{80, 160}));
  EXPECT_EQ(l[0].recvBytes, (std::vector<uint64_t>{200, 600}));
  EXPECT_DOUBLE_EQ(l[0].recvImbalance, 1.5);
}

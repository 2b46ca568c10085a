//===- TraceLineTest.cpp - The trace line codec ---------------------------===//
//
// Every event kind and field through encode -> decode, lines of real traces
// (written by mapp-run and mapp-sim before the codec existed, Inputs/)
// through decode -> encode byte for byte, and the located errors.

#include "mapp/trace/TraceLine.h"

#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

using namespace mapp::trace;

namespace {

auto fieldsOf(const EventLine &e) {
  return std::tie(e.id, e.name, e.stream, e.cat, e.op, e.phase, e.step, e.mb,
                  e.layer, e.chunk, e.peer, e.group, e.tag, e.seq, e.bytes,
                  e.b, e.e, e.cpu, e.sent, e.arrived, e.pending, e.sendBytes,
                  e.recvBytes);
}

/// A valid event of `cat`/`op`/`phase` with every field its op allows set
/// to a distinct value.
EventLine fullEvent(Category cat, Op op, Phase phase) {
  EventLine e;
  e.id = 41;
  e.name = "layer.3 \"q\"\\\t";
  e.stream = "comm";
  e.cat = cat;
  e.op = op;
  e.phase = phase;
  e.step = 2;
  e.mb = 5;
  e.layer = 3;
  e.chunk = 1;
  e.bytes = 1ull << 40;
  e.b = 1000;
  e.e = 9000;
  e.cpu = 700;
  if (op == Op::Send || op == Op::Recv) {
    e.peer = 6;
    e.tag = 77;
  }
  if (op == Op::Recv) {
    e.sent = 1500;
    e.arrived = 8000;
    e.pending = 0; // a bound by the send alone: 0 is a value here
  }
  if (isCollective(op)) {
    e.group = 4;
    e.seq = 12;
  }
  if (op == Op::AllToAll) {
    e.sendBytes = {1, 0, 3};
    e.recvBytes = {4, 5, 0};
  }
  return e;
}

TraceLine decodeOk(const std::string &text) {
  TraceLine out;
  LineError err;
  EXPECT_TRUE(decodeLine(text, {3, false}, out, err))
      << text << ": " << err.message;
  return out;
}

LineError decodeBad(const std::string &text, bool unterminated = false) {
  TraceLine out;
  LineError err;
  EXPECT_FALSE(decodeLine(text, {9, unterminated}, out, err)) << text;
  EXPECT_EQ(err.line, 9);
  return err;
}

} // namespace

TEST(TraceLine, EveryEventKindAndFieldRoundTrips) {
  int kinds = 0;
  for (int c = 0; c <= int(Category::Optimizer); ++c)
    for (int o = 0; o <= int(Op::Barrier); ++o)
      for (int p = 0; p <= int(Phase::BackwardWeight); ++p) {
        EventLine e = fullEvent(Category(c), Op(o), Phase(p));
        std::string line;
        appendEventLine(line, e);
        ASSERT_EQ(line.back(), '\n');
        line.pop_back();
        TraceLine got = decodeOk(line);
        ASSERT_EQ(got.type, TraceLine::Type::Event);
        EXPECT_TRUE(fieldsOf(got.event) == fieldsOf(e)) << line;
        ++kinds;
      }
  EXPECT_EQ(kinds, 5 * 9 * 5);
  // Defaults (nothing optional) stay defaults.
  EventLine bare;
  bare.name = "x";
  std::string line;
  appendEventLine(line, bare);
  EXPECT_EQ(line, "{\"id\":0,\"name\":\"x\",\"cat\":\"compute\",\"b\":0,"
                  "\"e\":0}\n");
  EXPECT_TRUE(fieldsOf(decodeOk(line).event) == fieldsOf(bare));
}

TEST(TraceLine, HeaderGroupFooterAndInlineGroupRoundTrip) {
  TraceLine h;
  h.type = TraceLine::Type::Header;
  h.header = {5, 8, 1, 1, 1, 2, 2, 2, "node-1", "cuda:1", "steady",
              4242, 77, 1700000000000000000, "00ff00ff00ff00ff", "0x1234abcd",
              "0-3,8"};
  TraceLine got = decodeOk(encodeLine(h));
  const HeaderLine &a = got.header, &b = h.header;
  EXPECT_EQ(std::tie(a.rank, a.world, a.dp, a.pp, a.tp, a.dpSize, a.ppSize,
                     a.tpSize, a.host, a.device, a.clock, a.pid,
                     a.monoStartNs, a.wallStartNs, a.runId, a.plan, a.cpus),
            std::tie(b.rank, b.world, b.dp, b.pp, b.tp, b.dpSize, b.ppSize,
                     b.tpSize, b.host, b.device, b.clock, b.pid,
                     b.monoStartNs, b.wallStartNs, b.runId, b.plan, b.cpus));

  TraceLine g;
  g.type = TraceLine::Type::Group;
  g.group = {3, "tp", {4, 5}};
  got = decodeOk(encodeLine(g));
  EXPECT_EQ(got.type, TraceLine::Type::Group);
  EXPECT_EQ(std::tie(got.group.id, got.group.kind, got.group.members),
            std::tie(g.group.id, g.group.kind, g.group.members));

  TraceLine f;
  f.type = TraceLine::Type::Footer;
  f.footer = {120, 3, 99999};
  got = decodeOk(encodeLine(f));
  EXPECT_EQ(got.type, TraceLine::Type::Footer);
  EXPECT_EQ(std::tie(got.footer.events, got.footer.dropped,
                     got.footer.monoEndNs),
            std::tie(f.footer.events, f.footer.dropped, f.footer.monoEndNs));

  TraceLine ar;
  ar.event = fullEvent(Category::Comm, Op::AllReduce, Phase::None);
  ar.event.group = -1;
  ar.inlineGroup = {-1, "dp", {1, 3}};
  got = decodeOk(encodeLine(ar));
  EXPECT_TRUE(fieldsOf(got.event) == fieldsOf(ar.event));
  EXPECT_EQ(got.inlineGroup.kind, "dp");
  EXPECT_EQ(got.inlineGroup.members, (std::vector<int>{1, 3}));
}

// Lines the writer wrote before it used the codec (Inputs/README.md): by
// mapp-run over MPI (sends, receives with stamps and `pending`, CPU times,
// all-reduces, data and optimizer events, phases) and by mapp-sim
// (all_to_all byte counts, streams). Every line decodes and encodes back to
// itself.
TEST(TraceLine, RealTraceLinesEncodeBackByteForByte) {
  for (const char *name : {"mapp-run-mpi-tp2pp2-rank-2.trace.jsonl",
                           "mapp-sim-moe-ep4-rank-0.sample.jsonl",
                           "mapp-sim-overlap-rank-0.sample.jsonl"}) {
    std::ifstream in(std::string(MAPP_SCAN_TEST_INPUTS) + "/" + name);
    ASSERT_TRUE(in) << name;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      TraceLine got;
      LineError err;
      ASSERT_TRUE(decodeLine(line, {n, false}, got, err))
          << name << ":" << n << ": " << err.message;
      EXPECT_EQ(encodeLine(got), line + "\n") << name << ":" << n;
    }
    EXPECT_GE(n, 12) << name;
  }
}

TEST(TraceLine, MissingKeyIsNamed) {
  LineError err = decodeBad(R"({"id":1,"cat":"compute","b":1,"e":2})");
  EXPECT_EQ(err.key, "name");
  EXPECT_EQ(err.message, "missing field 'name'");
  err = decodeBad(R"({"type":"header","format":"mapp-trace","version":1,)"
                  R"("world":2})");
  EXPECT_EQ(err.key, "rank");
  err = decodeBad(R"({"id":1,"name":"r","cat":"comm","op":"recv","b":1,)"
                  R"("e":2})");
  EXPECT_EQ(err.key, "peer");
  EXPECT_EQ(err.message, "recv event without 'peer'");
}

TEST(TraceLine, WrongTypeIsNamed) {
  LineError err = decodeBad(R"({"id":"1","name":"a","cat":"compute","b":1,)"
                            R"("e":2})");
  EXPECT_EQ(err.key, "id");
  EXPECT_EQ(err.message, "field 'id' must be an integer");
  err = decodeBad(R"({"id":1,"name":7,"cat":"compute","b":1,"e":2})");
  EXPECT_EQ(err.key, "name");
  EXPECT_EQ(err.message, "field 'name' must be a string");
  err = decodeBad(R"({"id":1,"name":"a","cat":"compute","b":1,"e":2,)"
                  R"("step":4294967296})");
  EXPECT_EQ(err.message, "field 'step' is out of range");
  err = decodeBad(R"({"id":1,"name":"a","cat":"compute","b":1,"e":2,)"
                  R"("bytes":-4})");
  EXPECT_EQ(err.key, "bytes");
  err = decodeBad(R"({"id":1,"name":"a","cat":"gpu","b":1,"e":2})");
  EXPECT_EQ(err.key, "cat");
  EXPECT_EQ(err.message, "unknown category 'gpu'");
  err = decodeBad(R"({"type":"trailer"})");
  EXPECT_EQ(err.key, "type");
  err = decodeBad("[1,2]");
  EXPECT_TRUE(err.notJson);
  EXPECT_EQ(err.message, "record is not a JSON object");
}

// A line cut off in the middle of a file is corrupt; the same bytes as the
// file's unterminated end are a truncated record (a crashed writer, or a
// live file the follower reads before the newline).
TEST(TraceLine, TruncatedMidFileVersusAtTheEnd) {
  const std::string cut = R"({"id":3,"name":"x",)";
  LineError mid = decodeBad(cut, false);
  EXPECT_TRUE(mid.notJson);
  EXPECT_EQ(mid.message.rfind("invalid JSON at column 20", 0), 0u)
      << mid.message;
  LineError end = decodeBad(cut, true);
  EXPECT_TRUE(end.notJson);
  EXPECT_EQ(end.message.rfind("truncated record at end of file, column 20", 0),
            0u)
      << end.message;
}

//===- Trace.h - In-memory traces and the trace reader ----------*- C++ -*-===//
//
// The analysis side of docs/trace-format.md: events of every rank, the
// communicators they refer to, and matching of p2p pairs and collectives.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_TRACE_H
#define MAPP_SCAN_TRACE_H

#include "mapp/trace/TraceFormat.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mapp::scan {

// The vocabulary is the trace-format library's (mapp/trace/TraceFormat.h).
using Cat = mapp::trace::Category;
using Op = mapp::trace::Op;
using Phase = mapp::trace::Phase;
using mapp::trace::categoryName;
using mapp::trace::isCollective;
using mapp::trace::opName;
using mapp::trace::parseCategory;
using mapp::trace::parseOp;

struct Event {
  int64_t id = 0;
  std::string name, stream;
  Cat cat = Cat::Compute;
  Op op = Op::None;
  Phase phase = Phase::None; // recorded pass (None: not recorded)
  int step = -1, mb = -1, layer = -1, chunk = -1;
  int peer = -1, group = -1;
  int64_t tag = -1, seq = -1;
  uint64_t bytes = 0;
  int64_t b = 0, e = 0;  // the rank's own clock, ns
  int64_t cpu = -1;      // thread CPU time of a host compute op (-1: none)
  double gb = 0, ge = 0; // aligned global time, ns (set by align())
  // recv: the sender's send call (its clock) and when the payload was
  // complete here (this rank's clock); -1 = not recorded. `pending`: the
  // landing is only bounded, in (pending, arrived] (0: by the send alone);
  // -1 = `arrived` is exact.
  int64_t sent = -1, arrived = -1, pending = -1;
  // Variable all_to_all (ep_dispatch / ep_combine): bytes sent to and
  // received from each group member, member order; empty = not recorded.
  std::vector<uint64_t> sendBytes, recvBytes;
  int line = 0;          // source line, for messages
};

struct Group {
  std::string kind;
  std::vector<int> members;
};

struct Header {
  int rank = 0, world = 1;
  int dp = 0, pp = 0, tp = 0, dpSize = 1, ppSize = 1, tpSize = 1;
  std::string host, device, clock;
  int64_t pid = 0; // 0: not recorded
  int64_t monoStartNs = 0, wallStartNs = 0;
  // Run identity (docs/trace-format.md): shared by every rank of one job;
  // empty in traces written before it existed.
  std::string runId, plan;
};

struct RankTrace {
  Header hdr;
  std::string path;
  std::vector<Event> events; // sorted by begin time
  std::map<int, Group> groups;
  int64_t dropped = 0;
  bool hasFooter = false;
};

struct Trace {
  int world = 0;
  int tp = 1, pp = 1, dp = 1;
  std::vector<RankTrace> ranks; // index = global rank
  std::vector<std::string> warnings;

  std::string rankLabel(int r) const;                // "DP0-PP1-TP1"
  std::string eventRef(int r, const Event &e) const; // "5:123"
};

/// A matched send/recv: ranks and indices into their event vectors.
struct P2PPair {
  int src, dst;
  size_t send, recv;
};
/// A matched collective: (rank, event index) of every member.
struct CollInstance {
  std::string kind;
  std::vector<int> members;
  int64_t seq;
  std::vector<std::pair<int, size_t>> events;
};

struct Matches {
  std::vector<P2PPair> p2p;
  std::vector<CollInstance> colls; // only complete instances
  size_t unmatchedSends = 0, unmatchedRecvs = 0, incompleteColls = 0;
};

struct ReadOptions {
  bool allowTruncated = false; // skip a cut-off last line (crashed run)
};

/// Reads DIR/rank-*.trace.jsonl. On failure returns false with a message
/// naming the file and line in *error: among others when the files are of
/// different runs (run_id, plan), a rank is missing, or a file holds events
/// that cannot be its header's rank's (a group without it, a send to itself).
bool readTraceDir(const std::string &dir, const ReadOptions &opts, Trace &out,
                  std::string *error);
/// Parses one rank file; exposed for tests.
bool readRankFile(const std::string &path, const ReadOptions &opts,
                  RankTrace &out, std::string *error);

/// Pairs sends with receives ((src, dst, tag) in issue order, the MPI/NCCL
/// non-overtaking rule) and gathers collectives by (kind, members, seq).
Matches matchEvents(const Trace &t);

} // namespace mapp::scan

#endif // MAPP_SCAN_TRACE_H

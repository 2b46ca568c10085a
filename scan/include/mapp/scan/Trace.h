//===- Trace.h - In-memory traces and the trace reader ----------*- C++ -*-===//
//
// The analysis side of docs/trace-format.md: events of every rank, the
// communicators they refer to, and matching of p2p pairs and collectives.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_TRACE_H
#define MAPP_SCAN_TRACE_H

#include "mapp/trace/TraceFormat.h"
#include "mapp/trace/TraceLine.h"

#include <cstdint>
#include <map>
#include <set>
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

/// An event as read (mapp/trace/TraceLine.h's line) with what analysis
/// adds to it.
struct Event : mapp::trace::EventLine {
  double gb = 0, ge = 0; // aligned global time, ns (set by align())
  int line = 0;          // source line, for messages
};

struct Group {
  std::string kind;
  std::vector<int> members;
};

/// A rank file's header record (docs/trace-format.md).
using Header = mapp::trace::HeaderLine;

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
/// A list of indices such as "0,2,4-7" (mapp-scan --ranks, a header's
/// `cpus`) added to `out`; false when malformed or empty.
bool parseIndexList(const std::string &s, std::set<int> &out);

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

//===- TraceLine.h - One line of a trace file, encoded and decoded once -*- C++ -*-===//
//
// The codec of docs/trace-format.md's lines: a header, a group, a footer or
// an event. The runtime's writer encodes with it; mapp-scan's reader and
// its live follower decode with it, so every key is written and read in one
// place. Decoding checks what one line alone can tell (keys present and of
// their type, the event's own consistency); what needs the whole file (a
// peer inside the world, a group declared) is the reader's.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRACE_TRACELINE_H
#define MAPP_TRACE_TRACELINE_H

#include "mapp/trace/TraceFormat.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mapp::trace {

/// {"type":"header",...}: the rank, its place in the job, the clock.
struct HeaderLine {
  int rank = 0, world = 1;
  int dp = 0, pp = 0, tp = 0, dpSize = 1, ppSize = 1, tpSize = 1;
  std::string host, device, clock;
  int64_t pid = 0; // 0: not recorded
  int64_t monoStartNs = 0, wallStartNs = 0;
  // Run identity: shared by every rank of one job; empty in traces written
  // before it existed (then not written).
  std::string runId, plan;
  // The CPUs this rank's process may run on ("0-1,4"; empty: not recorded,
  // e.g. a simulation): mapp-scan tells a host with more ranks than CPUs.
  std::string cpus;
};

/// {"type":"group",...}: a communicator events refer to by id.
struct GroupLine {
  int id = -1;
  std::string kind;
  std::vector<int> members;
};

/// {"type":"footer",...}: written at close.
struct FooterLine {
  int64_t events = 0, dropped = 0, monoEndNs = 0;
};

/// An event line (no "type"). Members are named after their keys; -1 (or
/// 0 for `bytes`, empty for strings and arrays) means "not in the line".
struct EventLine {
  int64_t id = 0;
  std::string name, stream;
  Category cat = Category::Compute;
  Op op = Op::None;
  Phase phase = Phase::None;
  int step = -1, mb = -1, layer = -1, chunk = -1;
  int peer = -1, group = -1;
  int64_t tag = -1, seq = -1;
  uint64_t bytes = 0;
  int64_t b = 0, e = 0; // begin and end on the rank's steady clock, ns
  int64_t cpu = -1;     // thread CPU time of a host compute op
  // recv: the sender's send call (its clock) and when the payload was
  // complete here; `pending`: the landing is only bounded, in
  // (pending, arrived] (0: by the send alone).
  int64_t sent = -1, arrived = -1, pending = -1;
  // Variable all_to_all: bytes sent to and received from each member.
  std::vector<uint64_t> sendBytes, recvBytes;
};

struct TraceLine {
  enum class Type { Header, Group, Footer, Event } type = Type::Event;
  HeaderLine header;
  GroupLine group;
  FooterLine footer;
  EventLine event;
  // An event's group in the inline form ("group_kind" and "members"
  // instead of a "group" id); kind empty: not inline.
  GroupLine inlineGroup;
};

/// Where a line stands in its file, for messages.
struct LineSource {
  int line = 0;              // 1-based
  bool unterminated = false; // the file ends inside this line
};

/// Why a line does not decode: the line, the key at fault ("" when the
/// line as a whole is: not JSON, an unknown type, an inconsistency between
/// keys) and the message ("missing field 'id'", ...).
struct LineError {
  int line = 0;
  std::string key;
  std::string message;
  bool notJson = false; // cut off or corrupt
};

/// Appends the line, newline included. Encoding what decode gives back
/// reproduces the writer's line byte for byte.
void appendHeaderLine(std::string &out, const HeaderLine &h);
void appendGroupLine(std::string &out, const GroupLine &g);
void appendFooterLine(std::string &out, const FooterLine &f);
void appendEventLine(std::string &out, const EventLine &e,
                     const GroupLine *inlineGroup = nullptr);
std::string encodeLine(const TraceLine &l);

/// Decodes one line (without its newline). False with `err` filled when it
/// is not a valid line of the format.
bool decodeLine(std::string_view text, const LineSource &where,
                TraceLine &out, LineError &err);

} // namespace mapp::trace

#endif // MAPP_TRACE_TRACELINE_H

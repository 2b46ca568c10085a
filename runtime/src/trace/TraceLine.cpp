//===- TraceLine.cpp - The trace line codec -------------------------------===//

#include "mapp/trace/TraceLine.h"

#include <nlohmann/json.hpp>

#include <climits>

using namespace mapp::trace;
using json = nlohmann::json;

//===----------------------------------------------------------------------===//
// Encoding
//===----------------------------------------------------------------------===//

namespace {
/// Writes `{"first":` then `,"key":` for every later key of one line.
struct LineWriter {
  std::string &out;
  bool first = true;
  explicit LineWriter(std::string &o) : out(o) { out += '{'; }
  void key(const char *k) {
    out += first ? "\"" : ",\"";
    first = false;
    out += k;
    out += "\":";
  }
  void num(const char *k, long long v) {
    key(k);
    out += std::to_string(v);
  }
  void unsignedNum(const char *k, unsigned long long v) {
    key(k);
    out += std::to_string(v);
  }
  void str(const char *k, std::string_view v) {
    key(k);
    appendJsonString(out, v);
  }
  template <typename T> void array(const char *k, const std::vector<T> &v) {
    key(k);
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i)
        out += ',';
      out += std::to_string(v[i]);
    }
    out += ']';
  }
  void end() { out += "}\n"; }
};
} // namespace

void mapp::trace::appendHeaderLine(std::string &out, const HeaderLine &h) {
  LineWriter w(out);
  w.str("type", "header");
  w.str("format", "mapp-trace");
  w.num("version", kFormatVersion);
  w.num("rank", h.rank);
  w.num("world", h.world);
  w.num("dp", h.dp);
  w.num("pp", h.pp);
  w.num("tp", h.tp);
  w.num("dp_size", h.dpSize);
  w.num("pp_size", h.ppSize);
  w.num("tp_size", h.tpSize);
  w.str("host", h.host);
  w.str("device", h.device);
  if (!h.cpus.empty())
    w.str("cpus", h.cpus);
  w.num("pid", h.pid);
  if (!h.clock.empty())
    w.str("clock", h.clock);
  w.num("mono_start_ns", h.monoStartNs);
  w.num("wall_start_ns", h.wallStartNs);
  if (!h.runId.empty())
    w.str("run_id", h.runId);
  if (!h.plan.empty())
    w.str("plan", h.plan);
  w.end();
}

void mapp::trace::appendGroupLine(std::string &out, const GroupLine &g) {
  LineWriter w(out);
  w.str("type", "group");
  w.num("id", g.id);
  w.str("kind", g.kind);
  w.array("members", g.members);
  w.end();
}

void mapp::trace::appendFooterLine(std::string &out, const FooterLine &f) {
  LineWriter w(out);
  w.str("type", "footer");
  w.num("events", f.events);
  w.num("dropped", f.dropped);
  w.num("mono_end_ns", f.monoEndNs);
  w.end();
}

void mapp::trace::appendEventLine(std::string &out, const EventLine &e,
                                  const GroupLine *inlineGroup) {
  namespace k = field;
  LineWriter w(out);
  w.num(k::kId, e.id);
  w.str(k::kName, e.name);
  w.str(k::kCat, categoryName(e.cat));
  if (e.op != Op::None)
    w.str(k::kOp, opName(e.op));
  w.num(k::kBegin, e.b);
  w.num(k::kEnd, e.e);
  auto optional = [&](const char *key, long long v) {
    if (v >= 0)
      w.num(key, v);
  };
  optional(k::kStep, e.step);
  optional(k::kMicrobatch, e.mb);
  optional(k::kLayer, e.layer);
  optional(k::kChunk, e.chunk);
  if (e.bytes)
    w.unsignedNum(k::kBytes, e.bytes);
  optional(k::kCpu, e.cpu);
  optional(k::kPeer, e.peer);
  optional(k::kTag, e.tag);
  optional(k::kSent, e.sent);
  optional(k::kArrived, e.arrived);
  optional(k::kPending, e.pending);
  optional(k::kGroup, e.group);
  optional(k::kSeq, e.seq);
  if (!e.sendBytes.empty() || !e.recvBytes.empty()) {
    w.array(k::kSendBytes, e.sendBytes);
    w.array(k::kRecvBytes, e.recvBytes);
  }
  if (!e.stream.empty())
    w.str(k::kStream, e.stream);
  if (e.phase != Phase::None)
    w.str(k::kPhase, phaseName(e.phase));
  if (inlineGroup && !inlineGroup->kind.empty()) {
    w.str("group_kind", inlineGroup->kind);
    w.array("members", inlineGroup->members);
  }
  w.end();
}

std::string mapp::trace::encodeLine(const TraceLine &l) {
  std::string out;
  switch (l.type) {
  case TraceLine::Type::Header:
    appendHeaderLine(out, l.header);
    break;
  case TraceLine::Type::Group:
    appendGroupLine(out, l.group);
    break;
  case TraceLine::Type::Footer:
    appendFooterLine(out, l.footer);
    break;
  case TraceLine::Type::Event:
    appendEventLine(out, l.event, &l.inlineGroup);
    break;
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Decoding
//===----------------------------------------------------------------------===//

namespace {
/// A line that does not decode: the key at fault ("" for the whole line).
struct Fault {
  std::string key, message;
};

int64_t getInt(const json &j, const char *key, int64_t dflt, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required)
      throw Fault{key, std::string("missing field '") + key + "'"};
    return dflt;
  }
  if (!it->is_number_integer())
    throw Fault{key, std::string("field '") + key + "' must be an integer"};
  return it->get<int64_t>();
}

/// An integer field stored in an int: out-of-range values are errors rather
/// than silently truncated (a truncated rank or peer would index out of
/// bounds later).
int getI32(const json &j, const char *key, int dflt, bool required) {
  int64_t v = getInt(j, key, dflt, required);
  if (v < INT32_MIN || v > INT32_MAX)
    throw Fault{key, std::string("field '") + key + "' is out of range"};
  return static_cast<int>(v);
}

std::string getStr(const json &j, const char *key, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required)
      throw Fault{key, std::string("missing field '") + key + "'"};
    return "";
  }
  if (!it->is_string())
    throw Fault{key, std::string("field '") + key + "' must be a string"};
  return it->get<std::string>();
}

std::vector<int> getMembers(const json &j) {
  auto it = j.find("members");
  const Fault bad{"members", "'members' must be a non-empty array of ranks"};
  if (it == j.end() || !it->is_array() || it->empty())
    throw bad;
  std::vector<int> m;
  for (const json &v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN ||
        v.get<int64_t>() > INT32_MAX)
      throw bad;
    m.push_back(v.get<int>());
  }
  return m;
}

std::vector<uint64_t> getByteArray(const json &j, const char *key) {
  std::vector<uint64_t> out;
  auto it = j.find(key);
  if (it == j.end())
    return out;
  if (!it->is_array())
    throw Fault{key, std::string("'") + key + "' must be an array"};
  for (const json &x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw Fault{key,
                  std::string("'") + key + "' must hold non-negative integers"};
    out.push_back(x.get<uint64_t>());
  }
  return out;
}

void decodeHeader(const json &j, HeaderLine &h) {
  if (getStr(j, "format", true) != "mapp-trace")
    throw Fault{"format", "header 'format' is not \"mapp-trace\""};
  int64_t v = getInt(j, "version", 0, true);
  if (v != kFormatVersion)
    throw Fault{"version", "unsupported trace version " + std::to_string(v) +
                               " (this mapp-scan reads version " +
                               std::to_string(kFormatVersion) + ")"};
  h.rank = getI32(j, "rank", 0, true);
  h.world = getI32(j, "world", 0, true);
  h.dp = getI32(j, "dp", 0, false);
  h.pp = getI32(j, "pp", 0, false);
  h.tp = getI32(j, "tp", 0, false);
  h.dpSize = getI32(j, "dp_size", 1, false);
  h.ppSize = getI32(j, "pp_size", 1, false);
  h.tpSize = getI32(j, "tp_size", 1, false);
  h.host = getStr(j, "host", false);
  h.device = getStr(j, "device", false);
  h.cpus = getStr(j, "cpus", false);
  h.clock = getStr(j, "clock", false);
  h.pid = getInt(j, "pid", 0, false);
  h.monoStartNs = getInt(j, "mono_start_ns", 0, false);
  h.wallStartNs = getInt(j, "wall_start_ns", 0, false);
  h.runId = getStr(j, "run_id", false);
  h.plan = getStr(j, "plan", false);
  if (h.world <= 0)
    throw Fault{"world", "header 'world' must be positive"};
  if (h.rank < 0 || h.rank >= h.world)
    throw Fault{"rank", "header rank " + std::to_string(h.rank) +
                            " is outside world size " +
                            std::to_string(h.world)};
  if (h.dpSize < 1 || h.ppSize < 1 || h.tpSize < 1)
    throw Fault{"", "header dp_size, pp_size and tp_size must be >= 1"};
  int64_t prod = int64_t(h.dpSize) * h.ppSize * h.tpSize; // each < 2^31
  if (prod != h.world)
    throw Fault{"world", "dp_size*pp_size*tp_size = " + std::to_string(prod) +
                             " differs from world " + std::to_string(h.world)};
}

void decodeEvent(const json &j, EventLine &e, GroupLine &inlineGroup) {
  namespace k = field;
  e.id = getInt(j, k::kId, 0, true);
  e.name = getStr(j, k::kName, true);
  std::string cat = getStr(j, k::kCat, true);
  if (!parseCategory(cat, e.cat))
    throw Fault{k::kCat, "unknown category '" + cat + "'"};
  std::string op = getStr(j, k::kOp, false);
  if (!parseOp(op, e.op))
    throw Fault{k::kOp, "unknown op '" + op + "'"};
  std::string phase = getStr(j, k::kPhase, false);
  if (!parsePhase(phase, e.phase))
    throw Fault{k::kPhase, "unknown phase '" + phase + "'"};
  e.b = getInt(j, k::kBegin, 0, true);
  e.e = getInt(j, k::kEnd, 0, true);
  if (e.e < e.b)
    throw Fault{k::kEnd, "event ends before it begins (e < b)"};
  e.step = getI32(j, k::kStep, -1, false);
  e.mb = getI32(j, k::kMicrobatch, -1, false);
  e.layer = getI32(j, k::kLayer, -1, false);
  e.chunk = getI32(j, k::kChunk, -1, false);
  int64_t bytes = getInt(j, k::kBytes, 0, false);
  if (bytes < 0)
    throw Fault{k::kBytes, "field 'bytes' must be non-negative"};
  e.bytes = static_cast<uint64_t>(bytes);
  e.cpu = getInt(j, k::kCpu, -1, false);
  if (j.contains(k::kCpu) && e.cpu < 0)
    throw Fault{k::kCpu, "field 'cpu' must be non-negative"};
  e.peer = getI32(j, k::kPeer, -1, false);
  e.tag = getInt(j, k::kTag, -1, false);
  e.group = getI32(j, k::kGroup, -1, false);
  e.seq = getInt(j, k::kSeq, -1, false);
  e.stream = getStr(j, k::kStream, false);
  e.sent = getInt(j, k::kSent, -1, false);
  e.arrived = getInt(j, k::kArrived, -1, false);
  e.pending = getInt(j, k::kPending, -1, false);
  for (const char *key : {k::kSent, k::kArrived, k::kPending})
    if (j.contains(key) && j[key].get<int64_t>() < 0)
      throw Fault{key, "'sent', 'arrived' and 'pending' must be non-negative"};
  if ((e.sent >= 0 || e.arrived >= 0 || e.pending >= 0) && e.op != Op::Recv)
    throw Fault{"", "'sent', 'arrived' and 'pending' are recv fields"};
  if (e.pending >= 0 && (e.arrived < 0 || e.pending > e.arrived))
    throw Fault{k::kPending, "'pending' needs an 'arrived' at or after it"};
  e.sendBytes = getByteArray(j, k::kSendBytes);
  e.recvBytes = getByteArray(j, k::kRecvBytes);
  if ((!e.sendBytes.empty() || !e.recvBytes.empty()) &&
      (e.op != Op::AllToAll || e.sendBytes.size() != e.recvBytes.size()))
    throw Fault{"", "'send_bytes' and 'recv_bytes' are all_to_all fields of "
                    "equal length"};
  if ((e.op == Op::Send || e.op == Op::Recv) && e.peer < 0)
    throw Fault{k::kPeer, std::string(opName(e.op)) + " event without 'peer'"};
  if (isCollective(e.op) && e.seq < 0)
    throw Fault{k::kSeq, std::string(opName(e.op)) + " event without 'seq'"};
  if (isCollective(e.op) && e.group < 0) {
    // Inline form: "group_kind" + "members" instead of a group id.
    inlineGroup.kind = getStr(j, "group_kind", true);
    inlineGroup.members = getMembers(j);
  }
}

/// "column C: why" of nlohmann's "[json.exception...] parse error at line
/// 1, column C: why", or the whole text.
std::string jsonFailure(const json::exception &ex, bool &hasColumn) {
  std::string what = ex.what();
  size_t p = what.find("column ");
  hasColumn = p != std::string::npos;
  return hasColumn ? what.substr(p) : what;
}
} // namespace

bool mapp::trace::decodeLine(std::string_view text, const LineSource &where,
                             TraceLine &out, LineError &err) {
  out = TraceLine();
  err = LineError();
  err.line = where.line;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception &ex) { // parse_error, or out_of_range
                                       // for a number that overflows
    bool hasColumn = false;
    std::string what = jsonFailure(ex, hasColumn);
    err.notJson = true;
    err.message = std::string(where.unterminated
                                  ? "truncated record at end of file, "
                              : hasColumn ? "invalid JSON at "
                                          : "invalid JSON: ") +
                  what;
    return false;
  }
  if (!j.is_object()) {
    err.notJson = true;
    err.message = "record is not a JSON object";
    return false;
  }
  try {
    std::string type = getStr(j, "type", false);
    if (type == "header") {
      out.type = TraceLine::Type::Header;
      decodeHeader(j, out.header);
    } else if (type == "group") {
      out.type = TraceLine::Type::Group;
      out.group.id = getI32(j, "id", 0, true);
      out.group.kind = getStr(j, "kind", true);
      out.group.members = getMembers(j);
    } else if (type == "footer") {
      out.type = TraceLine::Type::Footer;
      out.footer.events = getInt(j, "events", 0, false);
      out.footer.dropped = getInt(j, "dropped", 0, false);
      out.footer.monoEndNs = getInt(j, "mono_end_ns", 0, false);
    } else if (type.empty()) {
      out.type = TraceLine::Type::Event;
      decodeEvent(j, out.event, out.inlineGroup);
    } else {
      throw Fault{"type", "unknown record type '" + type + "'"};
    }
  } catch (const Fault &f) {
    err.key = f.key;
    err.message = f.message;
    return false;
  } catch (const json::exception &ex) {
    err.message = ex.what();
    return false;
  }
  return true;
}

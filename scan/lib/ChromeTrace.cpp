//===- ChromeTrace.cpp - Merged trace for Perfetto / chrome://tracing -----===//
//
// Written by hand rather than through nlohmann::json: the merged file can
// hold millions of events and should stream in bounded memory per step.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Report.h"

#include <cstdio>
#include <fstream>

using namespace mapp::scan;

namespace {
struct Writer {
  const ScanResult &s;
  double t0;
  std::map<std::pair<int, std::string>, int> tids;
  long long flowId = 0;

  int tid(int r, const Event &e) {
    std::string key = e.stream.empty() ? categoryName(e.cat) : e.stream;
    auto it = tids.find({r, key});
    if (it != tids.end())
      return it->second;
    int id = e.stream.empty() ? 1 + (int)e.cat : 10 + (int)tids.size();
    tids[{r, key}] = id;
    return id;
  }
  std::string ts(double ns) const {
    char b[48];
    std::snprintf(b, sizeof(b), "%.3f", (ns - t0) * 1e-3);
    return b;
  }
  void event(std::string &o, int r, const Event &e) {
    o += "{\"name\":";
    mapp::trace::appendJsonString(o, e.name);
    o += ",\"cat\":\"";
    o += categoryName(e.cat);
    o += "\",\"ph\":\"X\",\"pid\":" + std::to_string(r) +
         ",\"tid\":" + std::to_string(tid(r, e)) + ",\"ts\":" + ts(e.gb);
    char b[48];
    std::snprintf(b, sizeof(b), "%.3f", (e.ge - e.gb) * 1e-3);
    o += ",\"dur\":";
    o += b;
    o += ",\"args\":{\"id\":\"" + s.trace.eventRef(r, e) + "\"";
    auto num = [&](const char *k, long long v) {
      if (v >= 0)
        o += std::string(",\"") + k + "\":" + std::to_string(v);
    };
    num("step", e.step);
    num("mb", e.mb);
    num("layer", e.layer);
    num("chunk", e.chunk);
    if (e.bytes)
      num("bytes", e.bytes);
    num("peer", e.peer);
    num("tag", e.tag);
    num("seq", e.seq);
    if (e.op != Op::None)
      o += std::string(",\"op\":\"") + opName(e.op) + "\"";
    o += "}},\n";
  }
  void flow(std::string &o, const char *ph, long long id, int r, const Event &e,
            const char *name) {
    o += std::string("{\"name\":\"") + name + "\",\"cat\":\"flow\",\"ph\":\"" +
         ph + "\",\"id\":" + std::to_string(id) +
         ",\"pid\":" + std::to_string(r) +
         ",\"tid\":" + std::to_string(tid(r, e)) + ",\"ts\":" + ts(e.gb);
    if (ph[0] != 's')
      o += ",\"bp\":\"e\"";
    o += "},\n";
  }
};
} // namespace

bool mapp::scan::writeChromeTrace(const ScanResult &s, const ChromeOptions &o,
                                  const std::string &path, std::string *note,
                                  std::string *error) {
  const Trace &t = s.trace;
  auto rankIn = [&](int r) { return o.ranks.empty() || o.ranks.count(r); };
  auto stepIn = [&](int st) {
    return st < 0 || ((o.stepBegin < 0 || st >= o.stepBegin) &&
                      (o.stepEnd < 0 || st < o.stepEnd));
  };
  double t0 = 1e300;
  std::set<int> steps;
  for (int r = 0; r < t.world; ++r)
    for (const Event &e : t.ranks[r].events)
      if (rankIn(r) && stepIn(e.step)) {
        t0 = std::min(t0, e.gb);
        steps.insert(e.step);
      }
  if (t0 == 1e300)
    t0 = 0;
  Writer w{s, t0, {}, 0};
  // Bucket output by step so a size cap drops whole steps from the end.
  std::map<int, std::string> body;
  for (int r = 0; r < t.world; ++r) {
    if (!rankIn(r))
      continue;
    for (const Event &e : t.ranks[r].events)
      if (stepIn(e.step))
        w.event(body[e.step], r, e);
  }
  for (const P2PPair &p : s.matches.p2p) {
    const Event &se = t.ranks[p.src].events[p.send];
    const Event &re = t.ranks[p.dst].events[p.recv];
    if (!rankIn(p.src) || !rankIn(p.dst) || !stepIn(se.step))
      continue;
    std::string &b = body[se.step];
    long long id = ++w.flowId;
    w.flow(b, "s", id, p.src, se, "p2p");
    w.flow(b, "f", id, p.dst, re, "p2p");
    double win = std::min(se.ge, re.ge) - std::max(se.gb, re.gb);
    if (win > 0 && se.bytes) {
      char v[64];
      std::snprintf(v, sizeof(v), "%.3f", se.bytes * 8.0 / win);
      b += "{\"name\":\"bw to " + std::to_string(p.dst) +
           " (Gb/s)\",\"ph\":\"C\",\"pid\":" + std::to_string(p.src) +
           ",\"tid\":0,\"ts\":" + w.ts(se.gb) + ",\"args\":{\"Gbps\":" + v + "}},\n";
    }
  }
  for (const CollInstance &ci : s.matches.colls) {
    std::vector<std::pair<int, size_t>> ev;
    for (auto p : ci.events)
      if (rankIn(p.first))
        ev.push_back(p);
    if (ev.size() < 2)
      continue;
    const Event &first = t.ranks[ev[0].first].events[ev[0].second];
    if (!stepIn(first.step))
      continue;
    std::string &b = body[first.step];
    long long id = ++w.flowId;
    for (size_t k = 0; k < ev.size(); ++k)
      w.flow(b,
             k == 0               ? "s"
             : k + 1 == ev.size() ? "f"
                                  : "t",
             id, ev[k].first, t.ranks[ev[k].first].events[ev[k].second],
             ci.kind.c_str());
  }

  std::string head = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
  for (int r = 0; r < t.world; ++r) {
    if (!rankIn(r))
      continue;
    std::string pr = std::to_string(r);
    head += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pr +
            ",\"args\":{\"name\":\"" + t.rankLabel(r) + " (rank " + pr +
            ")\"}},\n";
    head += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pr +
            ",\"args\":{\"sort_index\":" + pr + "}},\n";
  }
  for (auto &[key, id] : w.tids) {
    head += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" +
            std::to_string(key.first) + ",\"tid\":" + std::to_string(id) +
            ",\"args\":{\"name\":";
    mapp::trace::appendJsonString(head, key.second);
    head += "}},\n";
  }
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    *error = path + ": cannot write";
    return false;
  }
  size_t cap = o.maxMb > 0 ? size_t(o.maxMb * 1024 * 1024) : SIZE_MAX;
  size_t size = head.size();
  out << head;
  int kept = 0, dropped = 0;
  for (auto &[step, b] : body) {
    // Events outside any step (step -1) always go in.
    if (step >= 0 && (dropped || size + b.size() > cap)) {
      ++dropped;
      continue;
    }
    size += b.size();
    out << b;
    kept += step >= 0;
  }
  char tail[512];
  std::snprintf(tail, sizeof(tail),
                "{\"name\":\"mapp-scan\",\"ph\":\"i\",\"s\":\"g\",\"pid\":0,\"tid\":0,"
                "\"ts\":0,\"args\":{\"steps_kept\":%d,\"steps_dropped_by_"
                "size_cap\":%d}}\n],\"otherData\":{\"generator\":\"mapp-scan\","
                "\"alignment\":\"%s\",\"time_zero_ns\":%.0f}}\n",
                kept, dropped, s.align.method.c_str(), t0);
  out << tail;
  if (dropped && note)
    *note = "size cap " + std::to_string(o.maxMb) + " MiB: kept " +
            std::to_string(kept) + " steps, dropped " + std::to_string(dropped);
  if (!out) {
    *error = path + ": write failed";
    return false;
  }
  return true;
}

//===- CommStats.cpp - Exposed communication, critical path, classes ------===//
//
// Exposed communication is the monitor library's definition
// (mapp/monitor/Exposure.h) applied to each rank's whole aligned timeline,
// so an all-reduce that runs beside the next step's compute is hidden too.
// The critical path walks back from each step's last event: a wait is
// followed to the rank that was waited for, so the path's communication is
// what the step actually paid for, whichever rank paid it.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/CommStats.h"
#include "mapp/scan/Diagnose.h"

#include <algorithm>
#include <cmath>
#include <set>

using namespace mapp::scan;
namespace mon = mapp::monitor;

double CriticalPathStep::totalCommNs() const {
  double s = 0;
  for (double v : commNs)
    s += v;
  return s;
}

int mapp::scan::commClassOf(const Trace &t, int r, const Event &e) {
  if (e.op == Op::Send || e.op == Op::Recv) {
    int own = t.ranks[r].hdr.pp;
    int peer = e.peer >= 0 && e.peer < t.world ? t.ranks[e.peer].hdr.pp : -1;
    return e.op == Op::Send ? mon::p2pClass(own, peer, t.pp)
                            : mon::p2pClass(peer, own, t.pp);
  }
  if (isCollective(e.op)) {
    auto g = t.ranks[r].groups.find(e.group);
    return g == t.ranks[r].groups.end()
               ? mon::CommOther
               : mon::commClassOfGroupKind(g->second.kind);
  }
  return e.cat == Cat::Comm ? mon::CommOther : -1;
}

static std::vector<mon::ExposureEvent> exposureEvents(const Trace &t, int r) {
  const auto &ev = t.ranks[r].events;
  std::vector<mon::ExposureEvent> x(ev.size());
  for (size_t i = 0; i < ev.size(); ++i) {
    x[i].b = ev[i].gb;
    x[i].e = ev[i].ge;
    x[i].commClass = commClassOf(t, r, ev[i]);
    x[i].track = mon::trackOf(ev[i].stream.c_str());
  }
  return x;
}

double mapp::scan::nearestRankPercentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t k = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::clamp<size_t>(k, 1, v.size()) - 1];
}

namespace {

/// Where each receive's send and each collective event's instance are.
struct Links {
  std::vector<std::vector<int>> pair; // rank, event -> Matches::p2p index
  std::vector<std::vector<int>> coll; // rank, event -> Matches::colls index
  Links(const Trace &t, const Matches &m) {
    pair.resize(t.world);
    coll.resize(t.world);
    for (int r = 0; r < t.world; ++r) {
      pair[r].assign(t.ranks[r].events.size(), -1);
      coll[r].assign(t.ranks[r].events.size(), -1);
    }
    for (size_t k = 0; k < m.p2p.size(); ++k)
      pair[m.p2p[k].dst][m.p2p[k].recv] = static_cast<int>(k);
    for (size_t k = 0; k < m.colls.size(); ++k)
      for (auto [r, i] : m.colls[k].events)
        coll[r][i] = static_cast<int>(k);
  }
};

/// A rank's events that can lie on a path (not regions, not empty), by end.
struct PathIndex {
  std::vector<std::vector<size_t>> byEnd;
  PathIndex(const Trace &t, const std::vector<std::vector<char>> &region) {
    byEnd.resize(t.world);
    for (int r = 0; r < t.world; ++r) {
      const auto &ev = t.ranks[r].events;
      for (size_t i = 0; i < ev.size(); ++i)
        if (!region[r][i] && ev[i].ge > ev[i].gb)
          byEnd[r].push_back(i);
      std::sort(byEnd[r].begin(), byEnd[r].end(), [&](size_t a, size_t b) {
        return ev[a].ge < ev[b].ge;
      });
    }
  }
  /// The event of rank r that ends last at or before t and began before t
  /// (-1: none).
  long before(const Trace &t, int r, double at) const {
    const auto &ev = t.ranks[r].events;
    const auto &idx = byEnd[r];
    auto it = std::upper_bound(idx.begin(), idx.end(), at,
                               [&](double x, size_t i) { return x < ev[i].ge; });
    for (int look = 0; it != idx.begin() && look < 64; ++look) {
      --it;
      if (ev[*it].gb < at)
        return static_cast<long>(*it);
    }
    return -1;
  }
};

} // namespace

// Walks back from the step's end: compute is the rank's own; a receive that
// was posted before its send began waited for the sender, so the path goes
// on at the send's begin on the sender; a collective at its last member's
// arrival on that member. The transfer after the wait is communication on
// the path; time between events is `other`.
static CriticalPathStep walkStep(const Trace &t, const Matches &m,
                                 const Links &links, const PathIndex &idx,
                                 int step, double start, double end,
                                 int endRank) {
  CriticalPathStep p;
  p.step = step;
  p.stepNs = end - start;
  p.endRank = endRank;
  int r = endRank;
  double at = end;
  size_t guard = 0, limit = 16;
  for (int q = 0; q < t.world; ++q)
    limit += 4 * t.ranks[q].events.size();
  while (at > start && guard++ < limit) {
    long k = idx.before(t, r, at);
    if (k < 0 || t.ranks[r].events[k].ge <= start) {
      p.otherNs += at - start;
      break;
    }
    const Event &e = t.ranks[r].events[k];
    p.otherNs += at - e.ge;
    at = e.ge;
    double from = std::max(e.gb, start);
    int cls = commClassOf(t, r, e);
    if (cls < 0) {
      p.computeNs += at - from;
      at = from;
      continue;
    }
    // Whom it waited for, and since when.
    int waitedRank = -1;
    double waitedSince = 0;
    if (e.op == Op::Recv && links.pair[r][k] >= 0) {
      const P2PPair &pp = m.p2p[links.pair[r][k]];
      const Event &s = t.ranks[pp.src].events[pp.send];
      if (s.gb > e.gb && s.gb < at) {
        waitedRank = pp.src;
        waitedSince = s.gb;
      }
    } else if (isCollective(e.op) && links.coll[r][k] >= 0) {
      const CollInstance &ci = m.colls[links.coll[r][k]];
      for (auto [mr, mi] : ci.events) {
        double arrival = t.ranks[mr].events[mi].gb;
        if (mr != r && arrival > e.gb && arrival < at &&
            (waitedRank < 0 || arrival > waitedSince)) {
          waitedRank = mr;
          waitedSince = arrival;
        }
      }
    }
    if (waitedRank < 0) {
      p.commNs[cls] += at - from;
      at = from;
      continue;
    }
    double since = std::max(waitedSince, start);
    p.commNs[cls] += at - since;
    at = since;
    r = waitedRank;
    ++p.rankSwitches;
  }
  return p;
}

ExposureAnalysis mapp::scan::analyzeExposure(const Trace &t,
                                             const Matches &m) {
  ExposureAnalysis a;
  std::map<int, double> stepEnd;
  std::map<int, int> stepEndRank;
  double first = 1e300;
  for (int r = 0; r < t.world; ++r)
    for (const Event &e : t.ranks[r].events) {
      first = std::min(first, e.gb);
      if (e.step < 0)
        continue;
      auto it = stepEnd.find(e.step);
      if (it == stepEnd.end() || e.ge > it->second) {
        stepEnd[e.step] = e.ge;
        stepEndRank[e.step] = r;
      }
    }
  std::map<int, size_t> stepPos;
  for (auto &[s, e] : stepEnd) {
    stepPos[s] = a.stepIds.size();
    a.stepIds.push_back(s);
  }

  std::vector<std::vector<char>> region(t.world);
  a.ranks.resize(t.world);
  for (int r = 0; r < t.world; ++r) {
    RankExposure &re = a.ranks[r];
    re.rank = r;
    re.stepExposedNs.assign(a.stepIds.size(), 0.0);
    std::vector<mon::ExposureEvent> x = exposureEvents(t, r);
    region[r] = mon::regionsOf(x);
    std::vector<double> exposed = mon::exposedTimes(x);
    const auto &ev = t.ranks[r].events;
    for (size_t i = 0; i < ev.size(); ++i) {
      if (exposed[i] < 0 || ev[i].step < 0)
        continue;
      ClassExposure &c = re.cls[x[i].commClass];
      c.commNs += ev[i].ge - ev[i].gb;
      c.exposedNs += exposed[i];
      ++c.events;
      re.commNs += ev[i].ge - ev[i].gb;
      re.exposedNs += exposed[i];
      re.stepExposedNs[stepPos[ev[i].step]] += exposed[i];
    }
  }

  Links links(t, m);
  PathIndex idx(t, region);
  double prev = first;
  for (auto &[s, e] : stepEnd) {
    a.path.push_back(walkStep(t, m, links, idx, s, prev, e, stepEndRank[s]));
    prev = e;
  }
  return a;
}

// The class an event's statistics go to ("" : none).
static std::string statClassOf(const Trace &t, int r, const Event &e) {
  int c = commClassOf(t, r, e);
  if (c >= 0) {
    if (e.op != Op::Send && e.op != Op::Recv)
      return mon::commClassName(c);
    std::string base = e.op == Op::Send ? "send" : "recv";
    if (c == mon::CommP2pForward)
      return base + "-forward";
    if (c == mon::CommP2pBackward)
      return base + "-backward";
    return base;
  }
  switch (e.cat) {
  case Cat::Optimizer:
    return "optimizer";
  case Cat::Data:
    return "data";
  case Cat::Memcpy:
    return "memcpy";
  default:
    break;
  }
  switch (e.phase) {
  case Phase::Forward:
    return "forward";
  case Phase::Backward:
  case Phase::BackwardInput:
  case Phase::BackwardWeight:
    return "backward";
  default:
    break;
  }
  // Traces without phases: the names' convention (fwd.attn, bwd.mlp).
  auto starts = [&](const char *p) { return e.name.rfind(p, 0) == 0; };
  if (starts("fwd") || starts("forward"))
    return "forward";
  if (starts("bwd") || starts("backward"))
    return "backward";
  return "compute";
}

std::vector<ClassStats> mapp::scan::eventClassStats(const Trace &t,
                                                    const Matches &m) {
  std::set<int> steps;
  for (int r = 0; r < t.world; ++r)
    for (const Event &e : t.ranks[r].events)
      if (e.step >= 0)
        steps.insert(e.step);
  double nSteps = std::max<size_t>(1, steps.size());

  // class -> rank -> durations; class -> rank -> waited-for time
  std::map<std::string, std::map<int, std::vector<double>>> dur;
  std::map<std::string, std::map<int, double>> late;
  std::map<std::string, bool> isComm;
  for (int r = 0; r < t.world; ++r) {
    const auto &ev = t.ranks[r].events;
    std::vector<char> region = mon::regionsOf(exposureEvents(t, r));
    for (size_t i = 0; i < ev.size(); ++i) {
      if (region[i] || ev[i].step < 0)
        continue;
      std::string c = statClassOf(t, r, ev[i]);
      dur[c][r].push_back(ev[i].ge - ev[i].gb);
      isComm[c] = ev[i].cat == Cat::Comm || ev[i].op != Op::None;
    }
  }
  for (const CollInstance &ci : m.colls) {
    if (ci.events.empty())
      continue;
    const auto [r0, i0] = ci.events[0];
    const Event &e0 = t.ranks[r0].events[i0];
    if (e0.step < 0)
      continue;
    std::vector<double> arrivals;
    int lastRank = -1;
    double last = -1e300;
    for (auto [r, i] : ci.events) {
      double a = t.ranks[r].events[i].gb;
      arrivals.push_back(a);
      if (a > last) {
        last = a;
        lastRank = r;
      }
    }
    late[statClassOf(t, r0, e0)][lastRank] += last - median(arrivals);
  }
  for (const P2PPair &p : m.p2p) {
    const Event &s = t.ranks[p.src].events[p.send];
    const Event &rv = t.ranks[p.dst].events[p.recv];
    if (rv.step < 0)
      continue;
    late[statClassOf(t, p.dst, rv)][p.src] +=
        std::clamp(s.gb - rv.gb, 0.0, rv.ge - rv.gb);
  }

  // Compute first (forward, backward, optimizer, data, ...), then
  // communication, each in a fixed order.
  static const char *order[] = {
      "forward",      "backward",      "optimizer",     "data",
      "memcpy",       "compute",       "tp",            "dp",
      "pp",           "ep",            "cp",            "other",
      "send-forward", "recv-forward",  "send-backward", "recv-backward",
      "send",         "recv"};
  std::vector<ClassStats> out;
  for (const char *name : order) {
    auto it = dur.find(name);
    if (it == dur.end())
      continue;
    ClassStats cs;
    cs.name = name;
    cs.comm = isComm[name];
    std::vector<double> perStep;
    double slowestNs = 0;
    for (auto &[r, v] : it->second) {
      RankClassStats rs;
      rs.rank = r;
      rs.events = v.size();
      rs.minNs = *std::min_element(v.begin(), v.end());
      rs.maxNs = *std::max_element(v.begin(), v.end());
      double sum = 0;
      for (double d : v)
        sum += d;
      rs.meanNs = sum / v.size();
      rs.p95Ns = nearestRankPercentile(v, 0.95);
      rs.perStepNs = sum / nSteps;
      perStep.push_back(rs.perStepNs);
      if (cs.slowestRank < 0 || rs.perStepNs > slowestNs) {
        cs.slowestRank = r;
        slowestNs = rs.perStepNs;
      }
      cs.ranks.push_back(rs);
    }
    double med = median(perStep);
    cs.slowestRatio = med > 0 ? slowestNs / med : 1;
    auto lt = late.find(name);
    if (lt != late.end())
      for (auto [r, ns] : lt->second)
        if (ns > 0 && ns / nSteps > cs.lateNsPerStep) {
          cs.lateRank = r;
          cs.lateNsPerStep = ns / nSteps;
        }
    out.push_back(std::move(cs));
  }
  return out;
}

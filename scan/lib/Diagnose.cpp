//===- Diagnose.cpp - Slow-rank and slow-link diagnosis -------------------===//
//
// Root cause vs victims: a slow rank's own operations take longer than the
// same operations on its peers, while its victims' operations take the
// normal time and the victims instead wait longer at sync points. So ranks
// are judged by compute durations against peers, never by step time or
// wait time. Links are judged in DiagnoseLinks.cpp.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

using namespace mapp::scan;

static std::string fmt(const char *f, double a, double b = 0) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), f, a, b);
  return buf;
}

static bool isComputeLike(const Event &e) { return e.cat != Cat::Comm; }

// What a compute op cost: its thread CPU time when every op has one, else
// its span on the aligned timeline.
static double costOf(const Event &e, bool cpuClock) {
  return cpuClock ? static_cast<double>(e.cpu) : e.ge - e.gb;
}

// Events that enclose another event of their stream: regions around ops
// (e.g. `optimizer` around the adamw ops of the rank's stage). Their time is
// their children's, counted there, and one region name wraps different work
// on different stages, so they are neither compute time nor compared.
static std::vector<std::vector<char>> findContainers(const Trace &t) {
  std::vector<std::vector<char>> container(t.world);
  for (int r = 0; r < t.world; ++r) {
    const auto &ev = t.ranks[r].events;
    container[r].assign(ev.size(), 0);
    std::map<std::string, std::vector<size_t>> byStream;
    for (size_t i = 0; i < ev.size(); ++i)
      byStream[ev[i].stream].push_back(i);
    for (auto &[stream, idx] : byStream) {
      std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        return ev[a].gb < ev[b].gb ||
               (ev[a].gb == ev[b].gb && ev[a].ge > ev[b].ge);
      });
      // Properly nested spans: an event contains something iff the next
      // one to begin lies inside it.
      for (size_t k = 0; k + 1 < idx.size(); ++k) {
        const Event &outer = ev[idx[k]], &inner = ev[idx[k + 1]];
        if (inner.gb < outer.ge && inner.ge <= outer.ge &&
            inner.ge - inner.gb < outer.ge - outer.gb)
          container[r][idx[k]] = 1;
      }
    }
  }
  return container;
}

double mapp::scan::weightedMedian(std::vector<std::pair<double, double>> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  double total = 0;
  for (auto [x, w] : v)
    total += w;
  if (total <= 0) {
    std::vector<double> xs;
    for (auto [x, w] : v)
      xs.push_back(x);
    return median(xs);
  }
  double acc = 0;
  for (auto [x, w] : v) {
    acc += w;
    if (acc >= total / 2)
      return x;
  }
  return v.back().first;
}

namespace {
/// One compute op of a rank compared with its peers.
struct OpRatio {
  size_t event = 0;      // index into the rank's events
  double ratio = 1;      // duration / peers' reference
  double weight = 0;     // the reference duration
  bool lockstep = false; // in the run of ops right after a collective
};
} // namespace

using DurationsByRank = std::map<int, std::vector<double>>;

// Reference of one op name: the median over the ranks that ran it of their
// own median -- with only two ranks the faster one's, unless `symmetric`
// (then their mean); < 0 with fewer than two.
static double peerReference(const DurationsByRank &perRank, bool symmetric) {
  if (perRank.size() < 2)
    return -1;
  std::vector<double> meds;
  for (auto &[r, v] : perRank)
    meds.push_back(median(v));
  return mapp::monitor::peerReference(meds, symmetric);
}

// Every leaf compute op (not a container) against the same op name on the
// other ranks. Ops in "lockstep" -- from a collective up to the rank's next
// communication -- start when their peers' do (members leave a collective
// together), under the same host conditions; they are compared with the
// peers' lockstep ops of the name where at least two ranks have some.
static std::vector<std::vector<OpRatio>>
rateComputeOps(const Trace &t, const std::vector<std::vector<char>> &container,
               const std::vector<std::vector<char>> &loadDependent,
               bool symmetric, bool cpuClock) {
  std::vector<std::vector<OpRatio>> ops(t.world);
  std::map<std::string, DurationsByRank> all, lockstep;
  for (int r = 0; r < t.world; ++r) {
    const auto &ev = t.ranks[r].events;
    std::vector<size_t> order(ev.size());
    for (size_t i = 0; i < ev.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ev[a].gb < ev[b].gb;
    });
    bool afterCollective = false;
    for (size_t i : order) {
      const Event &e = ev[i];
      if (!isComputeLike(e)) {
        afterCollective = e.op != Op::Send && e.op != Op::Recv;
        continue;
      }
      if (container[r][i] || loadDependent[r][i])
        continue;
      ops[r].push_back({i, 1, 0, afterCollective});
      all[e.name][r].push_back(costOf(e, cpuClock));
      if (afterCollective)
        lockstep[e.name][r].push_back(costOf(e, cpuClock));
    }
  }
  std::map<std::string, std::pair<double, double>> ref; // all, lockstep
  for (auto &[name, perRank] : all) {
    auto it = lockstep.find(name);
    ref[name] = {peerReference(perRank, symmetric),
                 it == lockstep.end() ? -1
                                      : peerReference(it->second, symmetric)};
  }
  for (int r = 0; r < t.world; ++r) {
    std::vector<OpRatio> rated;
    for (OpRatio o : ops[r]) {
      const Event &e = t.ranks[r].events[o.event];
      auto [refAll, refLockstep] = ref[e.name];
      double x = o.lockstep && refLockstep > 0 ? refLockstep : refAll;
      if (x <= 0)
        continue;
      o.ratio = costOf(e, cpuClock) / x;
      o.weight = x;
      rated.push_back(o);
    }
    ops[r] = std::move(rated);
  }
  return ops;
}

// A rank's compute ratio. A slow device slows every op, long or short, in
// every phase of the step. Host effects on a rank that is not slow hit some
// views only: a few long ops that were preempted, many few-us ops (timer,
// dispatch, first touch) that scale with nothing, or the ops of a rank that
// computes in bursts between long waits while its twin computed back to
// back (caches evicted, cores shared with other work; its lockstep ops are
// normal). So the ratio is the least of four medians of the op ratios:
// each op one vote, each op weighted by its reference duration (per unit of
// compute time), and the same two over the lockstep ops when there are
// any. `consistency` gets that view's share of ops slower than
// 1 + threshold/2.
static double rankRatio(const std::vector<OpRatio> &ops,
                        const DiagnoseOptions &opts, double *consistency) {
  double best = 0;
  bool first = true;
  for (bool lockstepOnly : {false, true})
    for (bool weighted : {false, true}) {
      std::vector<std::pair<double, double>> qw;
      double wSlow = 0, wAll = 0;
      for (const OpRatio &o : ops) {
        if (lockstepOnly && !o.lockstep)
          continue;
        double w = weighted ? o.weight : 1;
        qw.push_back({o.ratio, w});
        wAll += w;
        wSlow += o.ratio > 1 + opts.rankThreshold / 2 ? w : 0;
      }
      if (qw.empty())
        continue;
      double q = weightedMedian(qw);
      if (first || q < best) {
        best = q;
        if (consistency)
          *consistency = wAll > 0 ? wSlow / wAll : 0;
      }
      first = false;
    }
  return best;
}

// The lower quartile over the rank's op names of the name's median ratio:
// a slow device slows (nearly) every kind of work, so three kinds in four
// must be slower -- as a slow link must be slow in three steps of four.
static double lowerQuartileKindRatio(const Trace &t, int rank,
                                     const std::vector<OpRatio> &ops) {
  std::map<std::string, std::vector<double>> byName;
  for (const OpRatio &o : ops)
    byName[t.ranks[rank].events[o.event].name].push_back(o.ratio);
  std::vector<double> kinds;
  for (auto &[name, v] : byName)
    kinds.push_back(median(v));
  if (kinds.empty())
    return 1;
  std::sort(kinds.begin(), kinds.end());
  return kinds[(kinds.size() - 1) / 4];
}

// Whether every leaf compute event carries its thread CPU time.
static bool hasCpuTimes(const Trace &t,
                        const std::vector<std::vector<char>> &container) {
  bool any = false;
  for (int r = 0; r < t.world; ++r)
    for (size_t i = 0; i < t.ranks[r].events.size(); ++i) {
      const Event &e = t.ranks[r].events[i];
      if (!isComputeLike(e) || container[r][i])
        continue;
      if (e.cpu < 0)
        return false;
      any = true;
    }
  return any;
}

// A host whose ranks outnumber the CPUs their processes may run on (the
// headers' `cpus`, united per host): each rank's CPU time per op grows with
// what its neighbours evict from the caches it shares, wherever it is not
// off its core long enough for the test below (two rank threads of CI's
// 2-core VM read 1.20x apart in CPU time with a link delay beside them).
static void noteOversubscribedHosts(const Trace &t, Diagnosis &d) {
  std::map<std::string, std::pair<int, std::set<int>>> hosts;
  std::set<std::string> unknown;
  for (int r = 0; r < t.world; ++r) {
    const auto &h = t.ranks[r].hdr;
    auto &[ranks, cpus] = hosts[h.host];
    ++ranks;
    if (!parseIndexList(h.cpus, cpus))
      unknown.insert(h.host);
  }
  for (const auto &[host, hc] : hosts)
    if (!unknown.count(host) && static_cast<size_t>(hc.first) > hc.second.size())
      d.busyHosts.insert(host);
}

// A rank whose thread was often off its core shared the host with more
// runnable work than cores: its wall times (and its peers' waits on it) say
// little about its hardware. Said in the report, not judged.
static void noteOffCpuRanks(const Trace &t,
                            const std::vector<std::vector<char>> &container,
                            Diagnosis &d) {
  for (int r = 0; r < t.world; ++r) {
    double wall = 0, cpu = 0;
    for (size_t i = 0; i < t.ranks[r].events.size(); ++i) {
      const Event &e = t.ranks[r].events[i];
      if (!isComputeLike(e) || container[r][i])
        continue;
      wall += e.ge - e.gb;
      cpu += static_cast<double>(e.cpu);
    }
    if (wall <= 0)
      continue;
    double off = std::clamp(1 - cpu / wall, 0.0, 1.0);
    d.ranks[r].offCpuFraction = off;
    if (off > 0.25)
      d.busyHosts.insert(t.ranks[r].hdr.host);
    if (off > 0.25)
      d.warnings.push_back(
          fmt("rank %.0f was off its core for %.0f%% of its compute time: "
              "the host ran more threads than cores; compute was compared "
              "by CPU time",
              r, 100 * off));
  }
}

// Time spent waiting for peers vs moving bytes, per comm event.
static void splitComm(const Trace &t, const Matches &m,
                      std::vector<std::vector<double>> &wait) {
  wait.assign(t.world, {});
  for (int r = 0; r < t.world; ++r)
    wait[r].assign(t.ranks[r].events.size(), 0.0);
  for (const CollInstance &ci : m.colls) {
    double last = -1e300;
    for (auto [r, i] : ci.events)
      last = std::max(last, t.ranks[r].events[i].gb);
    for (auto [r, i] : ci.events) {
      const Event &e = t.ranks[r].events[i];
      wait[r][i] = std::clamp(last - e.gb, 0.0, e.ge - e.gb);
    }
  }
  for (const P2PPair &p : m.p2p) {
    const Event &s = t.ranks[p.src].events[p.send];
    const Event &rv = t.ranks[p.dst].events[p.recv];
    wait[p.dst][p.recv] = std::clamp(s.gb - rv.gb, 0.0, rv.ge - rv.gb);
  }
}

// A rank whose compute is slow and every one of whose links is slow too is
// one fault, not several: its links only look slow because that rank is
// late to send and to receive (a descheduled or throttled host). The link
// findings are folded into the rank's finding. So is a single link of a
// slow rank whose slowdown its compute slowdown explains (the rank's own
// copy into the link runs at its speed: a 1.5x slower rank sends 1.5x
// slower); a link much slower than its endpoint stays a finding. A rank
// with normal compute keeps its link findings (a NIC or cable fault looks
// like that).
static void attributeLinksToRanks(Diagnosis &d, double rankThreshold) {
  std::map<int, std::pair<size_t, size_t>> touching; // rank -> (links, slow)
  std::set<std::pair<int, int>> slowLinks;
  for (const Finding &f : d.findings)
    if (f.kind == "slow-link")
      slowLinks.insert({f.src, f.dst});
  for (const LinkStats &l : d.links)
    for (int r : {l.src, l.dst}) {
      ++touching[r].first;
      touching[r].second += slowLinks.count({l.src, l.dst});
    }
  std::set<int> absorbing;
  for (Finding &f : d.findings) {
    if (f.kind != "slow-rank")
      continue;
    auto [n, slow] = touching[f.rank];
    if (n < 2 || slow < n)
      continue;
    absorbing.insert(f.rank);
    f.magnitude += fmt("; all its %.0f links are slow too (counted as this "
                       "rank's fault)",
                       double(n));
  }
  std::map<int, size_t> slowRank; // rank -> index of its finding
  for (size_t i = 0; i < d.findings.size(); ++i)
    if (d.findings[i].kind == "slow-rank")
      slowRank[d.findings[i].rank] = i;
  // Decide first, then erase: the notes go into findings that erasing moves.
  std::vector<bool> drop(d.findings.size(), false);
  for (size_t i = 0; i < d.findings.size(); ++i) {
    const Finding &link = d.findings[i];
    if (link.kind != "slow-link")
      continue;
    if (absorbing.count(link.src) || absorbing.count(link.dst)) {
      drop[i] = true;
      continue;
    }
    double slowdown = link.ratio > 0 ? 1 / link.ratio : 1e300;
    for (int end : {link.src, link.dst}) {
      auto it = slowRank.find(end);
      if (it == slowRank.end() ||
          slowdown > d.findings[it->second].ratio * (1 + rankThreshold))
        continue;
      d.findings[it->second].magnitude +=
          "; link " + std::to_string(link.src) + "->" +
          std::to_string(link.dst) +
          fmt(" %.2fx slower, within its compute slowdown", slowdown);
      drop[i] = true;
      break;
    }
  }
  std::vector<Finding> kept;
  for (size_t i = 0; i < d.findings.size(); ++i)
    if (!drop[i])
      kept.push_back(std::move(d.findings[i]));
  d.findings = std::move(kept);
}


Diagnosis mapp::scan::diagnose(const Trace &t, const Matches &m,
                               const DiagnoseOptions &opts) {
  Diagnosis d;
  int R = t.world;
  d.ranks.resize(R);
  std::vector<std::vector<double>> wait;
  splitComm(t, m, wait);

  std::vector<std::vector<char>> container = findContainers(t);

  // Per rank time breakdown.
  for (int r = 0; r < R; ++r) {
    RankStats &rs = d.ranks[r];
    rs.rank = r;
    const auto &ev = t.ranks[r].events;
    if (ev.empty())
      continue;
    double first = 1e300, last = -1e300, busy = 0, cursor = -1e300;
    for (size_t i = 0; i < ev.size(); ++i) {
      const Event &e = ev[i];
      double dur = e.ge - e.gb;
      first = std::min(first, e.gb);
      last = std::max(last, e.ge);
      if (isComputeLike(e)) {
        rs.computeNs += container[r][i] ? 0 : dur;
      } else {
        rs.waitNs += wait[r][i];
        rs.commNs += dur - wait[r][i];
      }
      // Union of busy intervals (events of several streams may overlap).
      double b = std::max(e.gb, cursor);
      if (e.ge > b)
        busy += e.ge - b;
      cursor = std::max(cursor, e.ge);
    }
    rs.spanNs = last - first;
    rs.idleNs = std::max(0.0, rs.spanNs - busy);
  }

  // Measured step times on the aligned timeline.
  std::map<int, double> stepEnd;
  double first = 1e300;
  for (int r = 0; r < R; ++r)
    for (const Event &e : t.ranks[r].events) {
      first = std::min(first, e.gb);
      if (e.step >= 0) {
        auto it = stepEnd.find(e.step);
        if (it == stepEnd.end())
          stepEnd[e.step] = e.ge;
        else
          it->second = std::max(it->second, e.ge);
      }
    }
  double prev = first;
  for (auto &[s, e] : stepEnd) {
    d.stepNs.push_back(e - prev);
    prev = e;
  }
  d.steps = stepEnd.size();

  d.cpuClock = opts.cpuClock && hasCpuTimes(t, container);
  if (d.cpuClock) {
    noteOffCpuRanks(t, container, d);
    noteOversubscribedHosts(t, d);
  }
  std::vector<std::vector<char>> loadDependent;
  diagnoseRouting(t, container, d.cpuClock, opts, d, loadDependent);
  std::vector<std::vector<OpRatio>> ratios = rateComputeOps(
      t, container, loadDependent, /*symmetric=*/false, d.cpuClock);
  std::vector<std::vector<OpRatio>> symmetricRatios = rateComputeOps(
      t, container, loadDependent, /*symmetric=*/true, d.cpuClock);
  std::vector<double> all, deviations;
  for (int r = 0; r < R; ++r) {
    RankStats &rs = d.ranks[r];
    rs.compared = ratios[r].size();
    if (ratios[r].empty())
      continue;
    rs.computeRatio = rankRatio(ratios[r], opts, &rs.consistency);
    rs.kindRatioLowerQuartile = lowerQuartileKindRatio(t, r, ratios[r]);
    all.push_back(rs.computeRatio);
    deviations.push_back(rankRatio(symmetricRatios[r], opts, nullptr));
  }
  // Noise: the robust spread of the ranks' ratios against symmetric
  // references. Against the faster of two ranks the faster one's ratio is 1
  // by construction, which would halve the spread that two healthy peers
  // show on a noisy host.
  // A candidate is judged against the spread of the OTHER ranks: in a small
  // world its own deviation (and its twin's, which it drags the other way)
  // would otherwise be half the sample and hide it.
  // Its twin too: where a stage has two ranks (pp x dp=2, no tp) each is
  // the other's only peer, and a slow rank drags its twin's symmetric
  // deviation just as far the other way (a 2x culprit put its twin at
  // 0.67x, and the noise over 4 ranks hid the 2x; 1 CI run in 8).
  std::vector<int> compared; // index in `all` / `deviations` → rank
  for (const RankStats &rs : d.ranks)
    if (rs.compared)
      compared.push_back(rs.rank);
  std::map<int, std::vector<size_t>> byStage; // pp stage → indices
  for (size_t i = 0; i < compared.size(); ++i)
    byStage[t.ranks[compared[i]].hdr.pp].push_back(i);
  // How many ranks the noise of candidate `exclude` leaves out: itself, and
  // its twin where its stage has two.
  auto skipped = [&](int exclude) -> size_t {
    size_t n = byStage[t.ranks[compared[exclude]].hdr.pp].size();
    return n == 2 ? 2 : 1;
  };
  auto noiseOf = [&](int exclude) {
    std::vector<size_t> skip;
    if (exclude >= 0) {
      skip = byStage[t.ranks[compared[exclude]].hdr.pp];
      if (skip.size() != 2)
        skip = {static_cast<size_t>(exclude)};
    }
    std::vector<double> rest;
    for (size_t i = 0; i < deviations.size(); ++i)
      if (std::find(skip.begin(), skip.end(), i) == skip.end())
        rest.push_back(deviations[i]);
    return mapp::monitor::robustSpread(rest, 0.005);
  };
  double center = median(all);
  d.rankNoise = noiseOf(-1);
  std::set<std::pair<std::string, int64_t>> pids;
  for (int r = 0; r < R; ++r)
    pids.insert({t.ranks[r].hdr.host, t.ranks[r].hdr.pid});
  const size_t processes = pids.size();
  for (size_t i = 0; i < compared.size(); ++i) {
    const RankStats &rs = d.ranks[compared[i]];
    double excess = rs.computeRatio - std::max(1.0, center);
    if (rs.computeRatio < 1 + opts.rankThreshold ||
        rs.kindRatioLowerQuartile < 1 + opts.rankThreshold ||
        rs.consistency < opts.minSlowOpShare ||
        excess < mapp::monitor::kRankNoiseSpreads *
                     noiseOf(static_cast<int>(i)))
      continue;
    // Where CPU times say less of the hardware, a higher bar; a rank under
    // it is said, not judged.
    const std::string &host = t.ranks[rs.rank].hdr.host;
    double bar = 0;
    std::string why;
    if (d.cpuClock && processes > 1) {
      bar = opts.processRankThreshold;
      why = "of CPU time compared across processes";
    }
    // Fewer than two ranks besides the candidate (and its twin) to measure
    // the noise against: two healthy rank threads of CI's VM once measured
    // 1.35x and 1.41x apart in two runs in a row; a lone other rank (pp=2,
    // dp=1) is only the candidate's mirror, and a 1.11x clean run of it was
    // named in a CI rehearsal.
    if (d.cpuClock && compared.size() - skipped(static_cast<int>(i)) < 2 &&
        opts.busyHostRankThreshold > bar) {
      bar = opts.busyHostRankThreshold;
      why = "of a world with no other rank to measure the noise against";
    }
    if (d.busyHosts.count(host) && opts.busyHostRankThreshold > bar) {
      bar = opts.busyHostRankThreshold;
      why = "of a host that ran more threads than cores (" + host + ")";
    }
    bar = 1 + std::max(opts.rankThreshold, bar);
    if (std::min(rs.computeRatio, rs.kindRatioLowerQuartile) < bar) {
      d.warnings.push_back(fmt("rank %.0f's compute was %.2fx its peers' "
                               "median",
                               rs.rank, rs.computeRatio) +
                           fmt(", under the %.2fx bar ", bar) + why +
                           ": not judged");
      continue;
    }
    Finding f;
    f.kind = "slow-rank";
    f.rank = rs.rank;
    f.ratio = rs.computeRatio;
    f.confidence =
        std::clamp(rs.consistency, 0.0, 1.0) *
        mapp::monitor::rankSlowness(rs.computeRatio, opts.rankThreshold);
    f.magnitude = fmt("compute %.2fx peers' median (%.0f%% of its ops slower)",
                      rs.computeRatio, 100 * rs.consistency);
    auto rr = ratios[rs.rank];
    std::sort(rr.begin(), rr.end(), [](const OpRatio &a, const OpRatio &b) {
      return a.ratio > b.ratio;
    });
    for (size_t k = 0; k < rr.size() && k < opts.evidence; ++k)
      f.evidence.push_back(
          t.eventRef(rs.rank, t.ranks[rs.rank].events[rr[k].event]));
    // Victims: ranks that waited clearly longer than the culprit did.
    std::vector<std::pair<double, int>> w;
    for (const RankStats &o : d.ranks)
      if (o.rank != rs.rank && o.waitNs > 1.25 * rs.waitNs + 1e3)
        w.push_back({o.waitNs, o.rank});
    std::sort(w.rbegin(), w.rend());
    for (size_t k = 0; k < w.size() && k < 8; ++k)
      f.victims.push_back(w[k].second);
    d.findings.push_back(f);
  }

  diagnoseLinks(t, m, opts, d);
  attributeLinksToRanks(d, opts.rankThreshold);
  std::stable_sort(d.findings.begin(), d.findings.end(),
                   [](const Finding &a, const Finding &b) {
                     return a.confidence > b.confidence;
                   });

  return d;
}

//===- Align.cpp - Cross-rank clock alignment -----------------------------===//

#include "mapp/scan/Align.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <numeric>

using namespace mapp::scan;

namespace {
// Unknowns: o_r (global offset, us) at 2r and p_r (drift, ppm) at 2r+1;
// the mapping is T_r(x) = x + o_r + 1e-6 * p_r * x with x in us from origin.
constexpr double kPpm = 1e-6;

struct Eq {
  int idx[4];
  double coef[4];
  int n = 0;
  double rhs = 0, w = 1;
  void add(int i, double c) {
    idx[n] = i;
    coef[n++] = c;
  }
};

// Solves the normal equations by Cholesky; the priors make them definite.
std::vector<double> solve(const std::vector<Eq> &eqs, int n) {
  std::vector<double> A((size_t)n * n, 0.0), b(n, 0.0);
  for (const Eq &q : eqs) {
    double w2 = q.w * q.w;
    for (int i = 0; i < q.n; ++i) {
      b[q.idx[i]] += w2 * q.coef[i] * q.rhs;
      for (int j = 0; j < q.n; ++j)
        A[(size_t)q.idx[i] * n + q.idx[j]] += w2 * q.coef[i] * q.coef[j];
    }
  }
  for (int i = 0; i < n; ++i)
    A[(size_t)i * n + i] += 1e-12;
  for (int j = 0; j < n; ++j) {
    double d = A[(size_t)j * n + j];
    for (int k = 0; k < j; ++k)
      d -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
    d = std::sqrt(std::max(d, 1e-300));
    A[(size_t)j * n + j] = d;
    for (int i = j + 1; i < n; ++i) {
      double s = A[(size_t)i * n + j];
      for (int k = 0; k < j; ++k)
        s -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
      A[(size_t)i * n + j] = s / d;
    }
  }
  std::vector<double> y(n), x(n);
  for (int i = 0; i < n; ++i) {
    double s = b[i];
    for (int k = 0; k < i; ++k)
      s -= A[(size_t)i * n + k] * y[k];
    y[i] = s / A[(size_t)i * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double s = y[i];
    for (int k = i + 1; k < n; ++k)
      s -= A[(size_t)k * n + i] * x[k];
    x[i] = s / A[(size_t)i * n + i];
  }
  return x;
}

struct Fit {
  const Trace &t;
  std::vector<double> origin; // ns
  std::vector<double> x;      // unknowns
  double rel(int r, int64_t ns) const { return (ns - origin[r]) * 1e-3; }
  double T(int r, int64_t ns) const {
    double u = rel(r, ns);
    return u + x[2 * r] + kPpm * x[2 * r + 1] * u;
  }
  // Adds "T_a(xa) - T_b(xb) = 0".
  Eq diff(int a, int64_t xa, int b, int64_t xb, double w) const {
    Eq q;
    double ua = rel(a, xa), ub = rel(b, xb);
    q.add(2 * a, 1);
    q.add(2 * a + 1, kPpm * ua);
    q.add(2 * b, -1);
    q.add(2 * b + 1, -kPpm * ub);
    q.rhs = ub - ua;
    q.w = w;
    return q;
  }
};
} // namespace

AlignResult mapp::scan::alignClocks(Trace &t, const Matches &m,
                                    const AlignOptions &opts) {
  AlignResult res;
  int R = t.world;
  Fit fit{t, std::vector<double>(R, 0.0), std::vector<double>(2 * R, 0.0)};
  for (int r = 0; r < R; ++r) {
    const RankTrace &rt = t.ranks[r];
    fit.origin[r] = rt.events.empty() ? (double)rt.hdr.monoStartNs
                                      : (double)rt.events.front().b;
  }
  // Prior: the header's wall clock at start (NTP-grade, milliseconds).
  bool haveWall = true;
  for (const RankTrace &rt : t.ranks)
    haveWall &= rt.hdr.wallStartNs > 0;
  std::vector<double> prior(R, 0.0);
  for (int r = 0; r < R && haveWall; ++r) {
    const Header &h = t.ranks[r].hdr, &h0 = t.ranks[0].hdr;
    prior[r] =
        (fit.origin[r] - fit.origin[0] + double(h.wallStartNs - h.monoStartNs) -
         double(h0.wallStartNs - h0.monoStartNs)) *
        1e-3;
  }
  std::vector<Eq> eqs;
  for (int r = 0; r < R; ++r) {
    Eq po;
    po.add(2 * r, 1);
    po.rhs = prior[r];
    po.w = opts.enabled ? 1e-3 : 1e3;
    eqs.push_back(po);
    Eq pd;
    pd.add(2 * r + 1, 1);
    pd.w = opts.enabled && opts.fitDrift ? 1e-2 : 1e6;
    eqs.push_back(pd);
  }

  // Ranks on one host that trace its monotonic clock ("steady") read the
  // same clock: their mappings must agree at every local time, enforced at
  // the two ends of the traced window with a weight far above the anchors'.
  // Without this, collective exits skewed by scheduling (threads or
  // processes oversubscribing a host) bend the fit by thousands of ppm.
  std::map<std::string, int> hostLead;
  std::vector<std::pair<int, int>> tied;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const RankTrace &rt : t.ranks)
    if (!rt.events.empty()) {
      lo = std::min(lo, rt.events.front().b);
      hi = std::max(hi, rt.events.back().e);
    }
  for (int r = 0; r < R && opts.enabled && lo < hi; ++r) {
    const Header &h = t.ranks[r].hdr;
    if (h.clock != "steady" || h.host.empty())
      continue;
    auto [it, lead] = hostLead.try_emplace(h.host, r);
    if (lead)
      continue;
    for (int64_t at : {lo, hi})
      eqs.push_back(fit.diff(r, at, it->second, at, 1e3));
    tied.push_back({r, it->second});
    ++res.sharedClocks;
  }

  // Collective anchors and the components they connect.
  std::vector<int> comp(R);
  std::iota(comp.begin(), comp.end(), 0);
  std::function<int(int)> find = [&](int a) {
    return comp[a] == a ? a : comp[a] = find(comp[a]);
  };
  for (auto [a, b] : tied)
    comp[find(a)] = find(b);
  if (opts.enabled) {
    for (const CollInstance &ci : m.colls) {
      auto [r0, i0] = ci.events.front();
      for (size_t k = 1; k < ci.events.size(); ++k) {
        auto [r, i] = ci.events[k];
        eqs.push_back(fit.diff(r, t.ranks[r].events[i].e, r0,
                               t.ranks[r0].events[i0].e, 1.0));
        comp[find(r)] = find(r0);
        ++res.collAnchors;
      }
    }
    // NTP equations between components, one per rank pair, direction, step.
    struct Best {
      double slack = 1e300;
      int64_t sb = 0, re = 0;
    };
    std::map<std::tuple<int, int, int>, Best> best; // (src, dst, step)
    for (const P2PPair &p : m.p2p) {
      if (find(p.src) == find(p.dst))
        continue;
      const Event &s = t.ranks[p.src].events[p.send];
      const Event &rv = t.ranks[p.dst].events[p.recv];
      double slack = fit.rel(p.dst, rv.e) - fit.rel(p.src, s.b);
      Best &bb = best[{p.src, p.dst, s.step}];
      if (slack < bb.slack)
        bb = {slack, s.b, rv.e};
    }
    for (auto &[k, fwd] : best) {
      auto [a, b, step] = k;
      if (a > b)
        continue;
      auto it = best.find({b, a, step});
      if (it == best.end())
        continue;
      const Best &bwd = it->second;
      // (T_b(re_ab) - T_a(sb_ab)) - (T_a(re_ba) - T_b(sb_ba)) = 0
      Eq q1 = fit.diff(b, fwd.re, a, fwd.sb, 1.0);
      Eq q2 = fit.diff(a, bwd.re, b, bwd.sb, 1.0);
      Eq q;
      std::map<int, double> c;
      for (int i = 0; i < 4; ++i) {
        c[q1.idx[i]] += q1.coef[i];
        c[q2.idx[i]] -= q2.coef[i];
      }
      for (auto &[i, v] : c)
        if (v != 0)
          q.add(i, v);
      q.rhs = q1.rhs - q2.rhs;
      eqs.push_back(q);
      ++res.ntpEquations;
    }
  }
  std::map<int, int> comps;
  for (int r = 0; r < R; ++r)
    comps[find(r)] = 1;
  res.components = comps.size();

  auto violations = [&](std::vector<const P2PPair *> *out) {
    size_t n = 0;
    for (const P2PPair &p : m.p2p) {
      const Event &s = t.ranks[p.src].events[p.send];
      const Event &rv = t.ranks[p.dst].events[p.recv];
      if (fit.T(p.dst, rv.e) < fit.T(p.src, s.b)) {
        ++n;
        if (out)
          out->push_back(&p);
      }
    }
    return n;
  };
  fit.x = solve(eqs, 2 * R);
  res.p2pPairs = m.p2p.size();
  res.violationsBefore = violations(nullptr);
  // Constraint repair: an active set of violated causality constraints.
  for (int round = 0; round < 8 && opts.enabled; ++round) {
    std::vector<const P2PPair *> bad;
    if (!violations(&bad))
      break;
    for (const P2PPair *p : bad)
      eqs.push_back(fit.diff(p->dst, t.ranks[p->dst].events[p->recv].e, p->src,
                             t.ranks[p->src].events[p->send].b, 1.0));
    fit.x = solve(eqs, 2 * R);
    ++res.repairRounds;
  }
  res.violationsAfter = violations(nullptr);

  // Re-reference to rank 0's clock.
  double o0 = fit.x[0], s0 = 1 + kPpm * fit.x[1];
  res.clocks.resize(R);
  for (int r = 0; r < R; ++r) {
    RankClock &c = res.clocks[r];
    c.originNs = fit.origin[r];
    c.driftPpm = ((1 + kPpm * fit.x[2 * r + 1]) / s0 - 1) * 1e6;
    c.offsetNs = (fit.x[2 * r] - o0) / s0 * 1e3;
    for (Event &e : t.ranks[r].events) {
      e.gb = c.map(e.b);
      e.ge = c.map(e.e);
    }
  }
  double sum2 = 0;
  size_t cnt = 0;
  std::vector<double> rs2(R, 0);
  for (const CollInstance &ci : m.colls) {
    double mean = 0;
    for (auto [r, i] : ci.events)
      mean += t.ranks[r].events[i].ge;
    mean /= ci.events.size();
    for (auto [r, i] : ci.events) {
      double d = t.ranks[r].events[i].ge - mean;
      RankClock &c = res.clocks[r];
      rs2[r] += d * d;
      ++c.anchors;
      c.collMaxNs = std::max(c.collMaxNs, std::fabs(d));
      res.collMaxNs = std::max(res.collMaxNs, std::fabs(d));
      sum2 += d * d;
      ++cnt;
    }
  }
  for (int r = 0; r < R; ++r)
    if (res.clocks[r].anchors)
      res.clocks[r].collRmsNs = std::sqrt(rs2[r] / res.clocks[r].anchors);
  res.collRmsNs = cnt ? std::sqrt(sum2 / cnt) : 0;
  res.method = !opts.enabled ? "header wall clocks only"
               : res.components > 1
                   ? "collective anchors + NTP-style p2p between components"
                   : "collective anchors";
  if (opts.enabled && res.repairRounds)
    res.method += " + p2p constraint repair";
  if (opts.enabled && res.sharedClocks)
    res.method += " + shared host clocks";
  return res;
}

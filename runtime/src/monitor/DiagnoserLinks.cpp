//===- DiagnoserLinks.cpp - The window diagnosis of links -----------------===//
//
// As mapp-scan's slow-link rule (scan/lib/DiagnoseLinks.cpp) on summaries:
// a link's cost in a step is its fastest transfer (one undisturbed
// transfer per step suffices; scheduling noise only ever adds time), and
// it is compared with the other links of its class -- same host relation,
// same pipeline direction, same message size -- falling back to coarser
// classes when a class has fewer than three links. The noise bar is the
// class's pooled 90th percentile above its median over the window, taken
// of what the peers' transfers took at least when judging a link slow (by
// its own least), and of what they took at most when judging it back to
// normal (by its own most). Over MPI a receiver learns of a landing at its
// next poll: a receiver off its core for ms stretches only the upper
// bound, and pooled into the slow bar that lateness hid a 5 ms link delay
// on a busy host (test_monitor.py's MPI case).
//
// Stamped wire times (arrived on the receiver's clock - sent on the
// sender's) are exact between ranks of one host, which read one steady
// clock. Between hosts they carry the clocks' offset; both ends' summaries
// name the step's anchor, a collective both left at the same instant, and
// the difference of its ends on the two clocks is that offset (to the
// collective's exit skew and the clocks' drift over one step). A stamped
// cross-host link without a common anchor is not judged.
//
//===----------------------------------------------------------------------===//
#include "mapp/monitor/Diagnoser.h"
#include "mapp/monitor/DiagnosisCore.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

using namespace mapp::monitor;

namespace {
struct LinkNow {
  int src, dst;
  double wireNs;
  double wireLoNs; // at least this: a link is judged slow by it
  double bytes;    // per message
  bool intra;
  int dir; // +1 forward, -1 backward, 0 other (or the source unknown)
  size_t peers = 0;
  double ref = 0;
  double noiseLo = 0, noiseHi = 0; // peers' spread of wireLoNs, of wireNs
};
} // namespace

void WindowDiagnoser::judgeLinks(int64_t step,
                                 const std::vector<const StepSummary *> &got,
                                 std::vector<Alert> &out) {
  std::vector<const StepSummary *> byRank(world_, nullptr);
  for (const StepSummary *s : got)
    byRank[s->rank] = s;
  std::vector<LinkNow> links;
  for (const StepSummary *d : got)
    for (int k = 0; k < d->recvPeers; ++k) {
      const PeerStats &p = d->recvFrom[k];
      if (p.count == 0 || !p.hasWire() || p.peer < 0 || p.peer >= world_)
        continue;
      const StepSummary *s = byRank[p.peer];
      double wire = p.minWireNs;
      double wireLo = p.hasWireLo() ? p.minWireLoNs : 0; // none: proves nothing
      if (p.stamped && !(s && s->host == d->host)) {
        if (!s || !s->anchorKey || s->anchorKey != d->anchorKey)
          continue; // the clocks' offset is unknown
        wire -= d->anchorEndNs - s->anchorEndNs;
        if (p.hasWireLo())
          wireLo -= d->anchorEndNs - s->anchorEndNs;
      }
      if (p.stamped && wire <= 0)
        continue; // clocks that do not order the stamps say nothing
      LinkNow l{p.peer, d->rank, wire, std::max(0.0, wireLo),
                static_cast<double>(p.bytes) / p.count,
                s && s->host == d->host, 0};
      if (s) // the stage count is not in a summary: no wrap-around
        l.dir = pipelineDirection(s->pp, d->pp, 0);
      links.push_back(l);
      LinkWindow &h = linkHistory_[{l.src, l.dst}];
      if (h.hi.empty()) {
        h.hi.assign(opts_.window, -1.0);
        h.lo.assign(opts_.window, -1.0);
      }
      h.hi[step % opts_.window] = l.wireNs;
      h.lo[step % opts_.window] = l.wireLoNs;
    }
  if (links.size() < 2)
    return;
  LinkClasses classes;
  for (const LinkNow &l : links)
    classes.add(l.intra, l.bytes, l.dir);
  // A class's reference and noise from its links' windows, leaving the
  // judged link out in small classes (it would drag its own reference);
  // in classes of 8 or more one link moves neither.
  struct ClassStats {
    double ref, noiseLo, noiseHi;
    double usual; // the peers' median of wireNs over the window
  };
  auto stats = [&](const std::vector<size_t> &members, size_t self) {
    std::vector<double> now, pooledLo, pooledHi;
    for (size_t m : members) {
      if (m == self)
        continue;
      now.push_back(links[m].wireNs);
      const LinkWindow &h = linkHistory_[{links[m].src, links[m].dst}];
      for (size_t k = 0; k < h.hi.size(); ++k)
        if (h.hi[k] >= 0) {
          pooledHi.push_back(h.hi[k]);
          pooledLo.push_back(h.lo[k]);
        }
    }
    ClassStats c;
    c.ref = now.size() >= 2 ? median(now) : now.empty() ? 0 : now[0];
    c.usual = median(pooledHi);
    // A step where most peers' receivers polled late says nothing of what
    // a transfer takes: their usual time, if lower, is the reference (the
    // step's median had risen past a delayed link, which then read as
    // neither slow nor, once, as recovered mid-fault).
    if (!pooledHi.empty())
      c.ref = std::min(c.ref, c.usual);
    auto spread = [&](const std::vector<double> &pooled) {
      return std::max(percentile(pooled, 0.9) - median(pooled),
                      kLinkNoiseFloor * c.ref);
    };
    c.noiseLo = spread(pooledLo);
    c.noiseHi = spread(pooledHi);
    return c;
  };
  std::map<const std::vector<size_t> *, ClassStats> bigClass;
  const double T = opts_.linkThreshold;
  for (size_t i = 0; i < links.size(); ++i) {
    LinkNow &l = links[i];
    const std::vector<size_t> *members = &classes.classOf(i);
    if (members->size() < 2)
      continue;
    l.peers = members->size() - 1;
    ClassStats c;
    if (members->size() >= 8) {
      auto it = bigClass.find(members);
      if (it == bigClass.end())
        it = bigClass.emplace(members, stats(*members, SIZE_MAX)).first;
      c = it->second;
    } else {
      c = stats(*members, i);
    }
    l.ref = c.ref;
    l.noiseLo = c.noiseLo;
    l.noiseHi = c.noiseHi;
    if (l.ref <= 0)
      continue;
    auto barOf = [&](double noise) {
      return linkSlowBar(l.ref, T, noise, opts_.minLinkExcessNs);
    };
    // Slow by what the link took at least, against its peers' spread of
    // the same bound: an MPI receiver that polled late proves nothing.
    // Back to normal once it is no longer provably slow -- its lower bound
    // well under the bar -- or once what it took at most is back among its
    // peers'. (The upper bound alone never recovered a link whose receiver
    // polls later than its peers' in every step: a CI rehearsal's 3->7.)
    // With exact landings the two bounds and bars are one.
    const double bar = barOf(l.noiseLo), barHi = barOf(l.noiseHi);
    bool slow = l.wireLoNs >= bar;
    bool strong = l.wireLoNs >= l.ref + 2 * (bar - l.ref);
    bool normal = l.wireLoNs < (l.ref + bar) / 2 || l.wireNs < (l.ref + barHi) / 2;
    double ratio = l.wireNs / l.ref;
    Track &t = linkTracks_[{l.src, l.dst}];
    bool wasAlerted = t.alerted;
    if (!advance(t, slow, strong, normal, ratio, step))
      continue;
    Alert a;
    a.src = l.src;
    a.dst = l.dst;
    a.step = step;
    a.since = t.since;
    char buf[256];
    if (wasAlerted) {
      a.kind = "recovered";
      a.of = "slow-link";
      a.ratio = ratio;
      std::snprintf(buf, sizeof buf,
                    "link %d->%d: fastest transfer back to its peers' "
                    "(%.0f us vs %.0f us)",
                    l.src, l.dst, l.wireNs * 1e-3, l.ref * 1e-3);
      a.text = buf;
      out.push_back(a);
      continue;
    }
    a.kind = "slow-link";
    a.ratio = t.minRatio;
    a.cause = "wire";
    a.confidence = linkConfidence(1, t.minRatio, l.wireNs - l.ref,
                                  std::max(l.noiseLo, 1.0), T);
    a.evidence = {{"wire_us", l.wireNs * 1e-3},
                  {"peers_wire_us", l.ref * 1e-3},
                  {"bytes", l.bytes},
                  {"peers", static_cast<double>(l.peers)},
                  {"noise_us", l.noiseLo * 1e-3},
                  {"intra_host", l.intra ? 1.0 : 0.0}};
    std::snprintf(buf, sizeof buf,
                  "link %d->%d: fastest transfer %.0f us, %.2fx its %zu peer "
                  "links' %.0f us since step %lld (confidence %.2f)",
                  l.src, l.dst, l.wireNs * 1e-3, a.ratio, l.peers,
                  l.ref * 1e-3, static_cast<long long>(a.since),
                  a.confidence);
    a.text = buf;
    out.push_back(a);
  }
}

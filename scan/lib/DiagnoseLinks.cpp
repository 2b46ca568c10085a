//===- DiagnoseLinks.cpp - Slow-link diagnosis ----------------------------===//
//
// A link is rated by how fast it can move its messages, not by how long
// its transfers usually take: on a shared or oversubscribed host a sender
// or receiver that is descheduled, or a receiver that posts late, only ever
// adds time to a transfer. So each step contributes its fastest transfer
// on the link (one undisturbed transfer per step suffices), the link's
// cost is the median of those per-step minima (a disturbed minority of
// steps cannot move it), and the link is compared with links of its own
// class: same host relation, same message size, same pipeline direction.
// See docs/mapp-scan.md ("Slow link").
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

using namespace mapp::scan;

namespace {

using mapp::monitor::percentile;

struct LinkSamples {
  std::map<int, double> stepMin; // step -> fastest transfer (ns) in it
  // step -> what the fastest transfer took at least: equal to stepMin where
  // landings are exact, lower where only bounded (MPI's polls)
  std::map<int, double> stepMinLo;
  std::vector<double> bytes;
  std::vector<std::pair<double, size_t>> transfers; // (ns, pair index)
  int dir = 0; // pipelineDirection's
  double typicalBytes = 0;
};

} // namespace

void mapp::scan::diagnoseLinks(const Trace &t, const Matches &m,
                               const DiagnoseOptions &opts, Diagnosis &d) {
  // Per transfer, the wire time as an interval [lo, hi]. A recv that
  // records when its payload was complete here (`arrived`, the runtime's
  // P2P request time) bounds it from above by arrived - send begin, both on
  // the aligned timeline (the recv's clock offset maps `arrived`); the
  // recv's end bounds it too. An eager send's end bounds nothing: its bytes
  // may still be on the wire. `arrived` is exact on a thread world (lo =
  // hi); over MPI it is when a poll found the payload, and `pending`, the
  // poll before that found it missing, bounds it from below. Without
  // `arrived` (device marks, older traces), min(send end, recv end) - send
  // begin: exact for sends that wait for their receiver. Noise (scheduling,
  // a late receiver, a late poll) only ever widens the interval: a link is
  // judged slow by lo against what its peers achieve, hi.
  std::map<std::pair<int, int>, LinkSamples> samples;
  std::map<std::pair<int, int>, LinkStats> links;
  for (size_t k = 0; k < m.p2p.size(); ++k) {
    const P2PPair &p = m.p2p[k];
    const Event &s = t.ranks[p.src].events[p.send];
    const Event &rv = t.ranks[p.dst].events[p.recv];
    LinkStats &ls = links[{p.src, p.dst}];
    ls.src = p.src;
    ls.dst = p.dst;
    ls.intraHost = t.ranks[p.src].hdr.host == t.ranks[p.dst].hdr.host;
    ++ls.messages;
    ls.bytes += s.bytes;
    const double offset = rv.gb - rv.b; // the receiver's clock -> global
    double ns = rv.arrived >= 0
                    ? std::min(double(rv.arrived) + offset, rv.ge) - s.gb
                    : std::min(s.ge, rv.ge) - s.gb;
    if (ns <= 0 || !s.bytes)
      continue;
    LinkSamples &ss = samples[{p.src, p.dst}];
    auto [it, fresh] = ss.stepMin.try_emplace(s.step, ns);
    if (!fresh)
      it->second = std::min(it->second, ns);
    // A receiver whose first poll found the payload (`pending` 0) did not
    // wait for it and bounds nothing from below: such a transfer says
    // nothing of the wire, and a step of only those is not judged.
    if (rv.pending != 0) {
      double lo = rv.pending < 0 ? ns
                                 : std::clamp(double(rv.pending) + offset -
                                                  s.gb,
                                              0.0, ns);
      auto [lt, freshLo] = ss.stepMinLo.try_emplace(s.step, lo);
      if (!freshLo)
        lt->second = std::min(lt->second, lo);
    }
    ss.bytes.push_back(double(s.bytes));
    ss.transfers.push_back({ns, k});
    ls.pairs.push_back(k);
  }
  for (auto &[key, ss] : samples) {
    LinkStats &ls = links[key];
    std::vector<double> mins;
    for (auto &[step, ns] : ss.stepMin)
      mins.push_back(ns);
    ls.transferNs = median(mins);
    ls.steps = mins.size();
    ss.typicalBytes = median(ss.bytes);
    ss.dir = mapp::monitor::pipelineDirection(
        t.ranks[key.first].hdr.pp, t.ranks[key.second].hdr.pp, t.pp);
    ls.gbps = ss.typicalBytes * 8 / ls.transferNs;
  }

  // Links in the order of `samples`: classes name them by that index.
  std::vector<std::pair<int, int>> order;
  mapp::monitor::LinkClasses classes;
  for (auto &[key, ss] : samples) {
    order.push_back(key);
    classes.add(links.at(key).intraHost, ss.typicalBytes, ss.dir);
  }

  for (size_t index = 0; index < order.size(); ++index) {
    const std::pair<int, int> &key = order[index];
    const LinkSamples &ss = samples.at(key);
    LinkStats &ls = links[key];
    std::vector<std::pair<int, int>> peerLinks;
    for (size_t p : classes.classOf(index))
      peerLinks.push_back(order[p]);
    const std::vector<std::pair<int, int>> *peers = &peerLinks;
    // Judged against links of the other direction: the two directions of a
    // pipeline differ by their schedule (who waits, who computes while the
    // message moves), not only by their wire. Clean MPI runs on a quiet
    // 16-vCPU host had every forward link 3-4x the backward ones (224-292
    // us vs 60-83 us, 32 KiB) in 4 of 24 runs; an absolute excess there too.
    bool crossDirection = false;
    for (const auto &p : *peers)
      crossDirection |= samples.at(p).dir != ss.dir;
    ls.peers = peers->size();
    if (peers->size() < 2)
      continue;
    // The reference is what the other links of the class achieve: the
    // median of their per-step fastest transfers, pooled (leave-one-out,
    // so a slow link never drags its own reference). Noise is how far a
    // clean link's steps spread above its own median: the upper quartile's
    // distance, the median over the other links (a second slow link is
    // slow in every step, so it neither widens the spread nor, as one of
    // three or more, moves that median). On a quiet cluster or in mapp-sim
    // it is a few percent; among oversubscribed threads or processes it is
    // scheduling delay of tens of microseconds to milliseconds, independent
    // of the link's speed, i.e. additive. The upper quartile, not a higher
    // one: the statistic it bounds is a lower quartile over steps, which a
    // clean link pushes above its class's upper quartile only if nearly
    // every step of it was delayed.
    // Both from the peers' upper bounds (what they demonstrably achieve);
    // a link's steps are judged by their lower bounds.
    std::vector<double> pooled, spreads;
    for (const auto &p : *peers) {
      if (p == key)
        continue;
      std::vector<double> own;
      for (auto &[step, ns] : samples.at(p).stepMin)
        own.push_back(ns);
      pooled.insert(pooled.end(), own.begin(), own.end());
      spreads.push_back(percentile(own, 0.75) - median(own));
    }
    double ref = median(pooled);
    double noise =
        std::max(median(spreads), mapp::monitor::kLinkNoiseFloor * ref);
    d.linkNoise = std::max(d.linkNoise, noise / ref);
    // A slow link is slower than the reference even in its good steps: its
    // lower-quartile step is compared, so scheduling noise would have to
    // hit every transfer in three of four steps to fake a fault. The bar
    // is the threshold or three noise excursions, whichever is higher.
    std::vector<double> mins;
    for (auto &[step, ns] : ss.stepMinLo)
      mins.push_back(ns);
    if (mins.empty())
      continue; // its receivers never waited for it
    double floorNs = percentile(mins, 0.25);
    const bool busyEnd = d.busyHosts.count(t.ranks[ls.src].hdr.host) ||
                         d.busyHosts.count(t.ranks[ls.dst].hdr.host);
    double bar = mapp::monitor::linkSlowBar(
        ref, opts.linkThreshold, noise,
        std::max(crossDirection ? opts.crossDirectionMinExcessNs : 0,
                 busyEnd ? opts.busyHostMinLinkExcessNs : 0));
    ls.ratio = ref / ls.transferNs;
    size_t slowSteps = 0;
    for (double ns : mins)
      slowSteps += ns >= (ref + bar) / 2;
    ls.slowStepFraction = double(slowSteps) / mins.size();
    if (floorNs < bar || ls.slowStepFraction < 2.0 / 3)
      continue;
    Finding f;
    f.kind = "slow-link";
    f.src = ls.src;
    f.dst = ls.dst;
    f.ratio = ls.ratio;
    // Consistency x size of the slowdown x how far it stands out of the
    // class's noise (3 excursions, the bar: 0.5; 6 or more: 1).
    f.confidence =
        ls.slowStepFraction *
        mapp::monitor::linkConfidence(ref, ls.transferNs, floorNs - ref,
                                      noise, opts.linkThreshold);
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "effective bandwidth %.3g Gb/s, %.2fx peer links' median "
                  "(fastest transfer per step %.0f us vs %.0f us, slow in "
                  "%.0f%% of %zu steps)",
                  ls.gbps, ls.ratio, ls.transferNs * 1e-3, ref * 1e-3,
                  100 * ls.slowStepFraction, ls.steps);
    f.magnitude = buf;
    auto slow = ss.transfers;
    std::sort(slow.begin(), slow.end(), std::greater<>());
    for (size_t k = 0; k < slow.size() && k < opts.evidence / 2; ++k) {
      const P2PPair &p = m.p2p[slow[k].second];
      f.evidence.push_back(t.eventRef(p.src, t.ranks[p.src].events[p.send]));
      f.evidence.push_back(t.eventRef(p.dst, t.ranks[p.dst].events[p.recv]));
    }
    d.findings.push_back(f);
  }
  for (auto &[key, ls] : links)
    d.links.push_back(ls);
}

//===- DiagnoseRouting.cpp - Expert-parallel routing imbalance ------------===//
//
// Expert parallelism moves each token to the rank that owns its expert
// (a variable all_to_all, ep_dispatch), runs the experts there and moves
// the results back (ep_combine). The experts' work on a rank is as large
// as the tokens routed to it, so a router that sends most tokens to one
// expert makes its rank the straggler of the ep group: its expert ops
// take longer than its peers', the peers wait at the combine. That is not
// a slow device -- per token the rank is as fast as its peers -- and the
// remedy is the routing (aux loss, capacity), not the hardware.
//
// So, per rank, a dispatch-like exchange X is paired with the rank's next
// variable all_to_all Y over the same group that returns what X brought
// (Y sends per member what X received, and receives what X sent); the
// compute between them is the experts' work on X's tokens. Per ep group
// and exchange name, each member's tokens (bytes X received) and expert
// time are summed over the trace. A member is named `routing-imbalance`
// when it received at least `routingImbalance` x the group's mean, its
// expert time is above its peers' by the rank threshold (it is the
// straggler). Its time per byte against the peers' (where a peer received
// tokens) says whether it is slower per token as well. Those expert ops are
// left out of the slow-rank comparison on every rank -- their cost follows
// the routing, not the device -- so a routing straggler is not a slow
// rank, while a slow device still is, by all its other ops.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Diagnose.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

using namespace mapp::scan;

namespace {

/// A member's sums over one (group, exchange name).
struct MemberLoad {
  double bytes = 0;  // tokens received (bytes), over the trace
  double costNs = 0; // expert compute after those exchanges
  size_t exchanges = 0;
  std::vector<std::pair<double, size_t>> segments; // (cost, exchange event)
};

struct Exchange {
  std::vector<int> members;
  std::map<int, MemberLoad> byRank;
};

bool isVariableAllToAll(const Event &e) {
  return e.op == Op::AllToAll && !e.recvBytes.empty() &&
         e.recvBytes.size() == e.sendBytes.size();
}

} // namespace

void mapp::scan::diagnoseRouting(
    const Trace &t, const std::vector<std::vector<char>> &container,
    bool cpuClock, const DiagnoseOptions &opts, Diagnosis &d,
    std::vector<std::vector<char>> &loadDependent) {
  loadDependent.assign(t.world, {});
  std::map<std::pair<std::string, std::string>, Exchange> exchanges;
  for (int r = 0; r < t.world; ++r) {
    const auto &ev = t.ranks[r].events;
    loadDependent[r].assign(ev.size(), 0);
    std::vector<size_t> order(ev.size());
    for (size_t i = 0; i < ev.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ev[a].gb < ev[b].gb;
    });
    for (size_t k = 0; k < order.size(); ++k) {
      const Event &x = ev[order[k]];
      if (!isVariableAllToAll(x))
        continue;
      // The rank's next communication: the return exchange, with only
      // compute between.
      size_t j = k + 1;
      std::vector<size_t> work;
      for (; j < order.size() && ev[order[j]].cat != Cat::Comm; ++j)
        if (!container[r][order[j]])
          work.push_back(order[j]);
      if (j == order.size())
        continue;
      const Event &y = ev[order[j]];
      if (!isVariableAllToAll(y) || y.group != x.group ||
          y.sendBytes != x.recvBytes || y.recvBytes != x.sendBytes)
        continue;
      auto g = t.ranks[r].groups.find(x.group);
      if (g == t.ranks[r].groups.end() ||
          g->second.members.size() != x.recvBytes.size())
        continue;
      std::string groupKey = g->second.kind;
      for (int m : g->second.members)
        groupKey += "," + std::to_string(m);
      Exchange &xc = exchanges[{groupKey, x.name}];
      xc.members = g->second.members;
      MemberLoad &ml = xc.byRank[r];
      double cost = 0;
      for (size_t i : work) {
        loadDependent[r][i] = 1;
        cost += cpuClock ? static_cast<double>(ev[i].cpu)
                         : ev[i].ge - ev[i].gb;
      }
      for (uint64_t b : x.recvBytes)
        ml.bytes += static_cast<double>(b);
      ml.costNs += cost;
      ++ml.exchanges;
      ml.segments.push_back({cost, order[k]});
      k = j; // Y returns X's tokens: it opens no pair of its own
    }
  }

  // Per (group, hot member): the exchange names that flagged it.
  struct Verdict {
    std::vector<int> members;
    std::vector<std::string> names;
    double bytes = 0, meanBytes = 0, costNs = 0, peerCostNs = 0;
    double perByte = -1; // own / peers' cost per byte (-1: no peer had any)
    std::vector<double> memberBytes;
    std::vector<std::pair<double, std::pair<int, size_t>>> evidence;
  };
  std::map<std::pair<std::string, int>, Verdict> verdicts;
  for (auto &[key, xc] : exchanges) {
    if (xc.byRank.size() != xc.members.size() || xc.members.size() < 2)
      continue; // a member without the exchange: not one ep group's view
    std::vector<double> bytes;
    for (int m : xc.members)
      bytes.push_back(xc.byRank[m].bytes);
    double mean = 0;
    for (double b : bytes)
      mean += b / bytes.size();
    size_t hot = std::max_element(bytes.begin(), bytes.end()) - bytes.begin();
    int hotRank = xc.members[hot];
    const MemberLoad &h = xc.byRank[hotRank];
    if (mean <= 0 || h.bytes < opts.routingImbalance * mean)
      continue;
    std::vector<double> peerCost, peerPerByte;
    for (int m : xc.members) {
      if (m == hotRank)
        continue;
      const MemberLoad &o = xc.byRank[m];
      peerCost.push_back(o.costNs);
      if (o.bytes > 0)
        peerPerByte.push_back(o.costNs / o.bytes);
    }
    double ref = median(peerCost);
    if (h.costNs < (1 + opts.rankThreshold) * ref || h.costNs <= 0)
      continue; // imbalanced, but not what the group waits for
    double perByte = -1;
    if (!peerPerByte.empty() && median(peerPerByte) > 0)
      perByte = h.costNs / h.bytes / median(peerPerByte);
    Verdict &v = verdicts[{key.first, hotRank}];
    v.members = xc.members;
    v.names.push_back(key.second);
    v.bytes += h.bytes;
    v.meanBytes += mean;
    v.costNs += h.costNs;
    v.peerCostNs += ref;
    v.perByte = std::max(v.perByte, perByte);
    if (v.memberBytes.empty())
      v.memberBytes.assign(bytes.size(), 0);
    for (size_t i = 0; i < bytes.size(); ++i)
      v.memberBytes[i] += bytes[i];
    for (auto [cost, ev] : h.segments)
      v.evidence.push_back({cost, {hotRank, ev}});
  }

  for (auto &[key, v] : verdicts) {
    int rank = key.second;
    Finding f;
    f.kind = "routing-imbalance";
    f.rank = rank;
    f.members = v.members;
    f.memberBytes = v.memberBytes;
    f.ratio = v.bytes / v.meanBytes;
    double slower = v.peerCostNs > 0 ? v.costNs / v.peerCostNs : 0;
    size_t member =
        std::find(v.members.begin(), v.members.end(), rank) - v.members.begin();
    f.confidence =
        std::clamp((f.ratio - 1) / (2 * (opts.routingImbalance - 1)), 0.0,
                   1.0) *
        (slower > 0 ? std::clamp((slower - 1) / (2 * opts.rankThreshold), 0.0,
                                 1.0)
                    : 1.0);
    char buf[1024];
    std::string times =
        slower > 0 ? (std::snprintf(buf, sizeof buf, "%.2fx its peers'",
                                    slower),
                      std::string(buf))
                   : std::string("while its peers had none");
    bool slowPerByte = v.perByte >= 1 + opts.rankThreshold;
    std::string perByte =
        v.perByte > 0
            ? (std::snprintf(buf, sizeof buf, ", per byte %.2fx", v.perByte),
               std::string(buf))
            : std::string("");
    std::string names;
    for (const std::string &n : v.names)
      names += (names.empty() ? "" : ", ") + n;
    std::snprintf(
        buf, sizeof buf,
        "ep member %zu of %zu (owner of experts [%zu*E/%zu, %zu*E/%zu)) "
        "received %.2fx the group's mean tokens (%s); its expert compute "
        "%s%s: %s",
        member, v.members.size(), member, v.members.size(), member + 1,
        v.members.size(), f.ratio, names.c_str(), times.c_str(),
        perByte.c_str(),
        slowPerByte ? "the router's load, and slower per token too (a slow "
                      "device as well: see its compute)"
                    : "the router's load, not a slow device");
    f.magnitude = buf;
    std::sort(v.evidence.rbegin(), v.evidence.rend());
    for (size_t k = 0; k < v.evidence.size() && k < opts.evidence; ++k) {
      auto [r, i] = v.evidence[k].second;
      f.evidence.push_back(t.eventRef(r, t.ranks[r].events[i]));
    }
    for (int m : v.members)
      if (m != rank)
        f.victims.push_back(m);
    d.findings.push_back(f);
  }
}

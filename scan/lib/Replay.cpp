//===- Replay.cpp - What-if replay of a measured trace --------------------===//

#include "mapp/scan/Replay.h"

#include <algorithm>
#include <numeric>

using namespace mapp::scan;

SimJob mapp::scan::traceToJob(const Trace &t, const Matches &m,
                              const Diagnosis &d,
                              const std::vector<Finding> &repair) {
  SimJob job;
  job.world = t.world;
  job.tp = t.tp;
  job.pp = t.pp;
  job.dp = t.dp;
  job.programs.assign(t.world, {});
  std::map<int, double> rankScale;
  std::map<std::pair<int, int>, double> linkScale;
  for (const Finding &f : repair) {
    if (f.kind == "slow-rank" && f.ratio > 0)
      rankScale[f.rank] = 1 / f.ratio;
    else if (f.kind == "slow-link")
      linkScale[{f.src, f.dst}] = std::min(1.0, f.ratio);
  }
  // Per event: its role in a match.
  std::vector<std::vector<int>> kind(
      t.world); // 0 plain, 1 send, 2 recv, 3 coll
  std::vector<std::vector<double>> xfer(t.world);
  std::vector<std::vector<int>> grp(t.world);
  for (int r = 0; r < t.world; ++r) {
    kind[r].assign(t.ranks[r].events.size(), 0);
    xfer[r].assign(t.ranks[r].events.size(), 0);
    grp[r].assign(t.ranks[r].events.size(), -1);
  }
  for (const P2PPair &p : m.p2p) {
    const Event &s = t.ranks[p.src].events[p.send];
    kind[p.src][p.send] = 1;
    kind[p.dst][p.recv] = 2;
    double x = s.ge - s.gb;
    auto it = linkScale.find({p.src, p.dst});
    if (it != linkScale.end())
      x *= it->second;
    xfer[p.src][p.send] = x;
  }
  std::map<std::vector<int>, int> groupIds;
  for (const CollInstance &ci : m.colls) {
    std::vector<int> key = ci.members;
    key.push_back(-1); // kind separator
    for (char ch : ci.kind)
      key.push_back(ch);
    auto it = groupIds.find(key);
    if (it == groupIds.end()) {
      it = groupIds.emplace(key, job.groups.size()).first;
      job.groups.push_back({ci.kind, ci.members});
    }
    double last = -1e300, end = 0;
    for (auto [r, i] : ci.events) {
      last = std::max(last, t.ranks[r].events[i].gb);
      end += t.ranks[r].events[i].ge;
    }
    end /= ci.events.size();
    for (auto [r, i] : ci.events) {
      kind[r][i] = 3;
      grp[r][i] = it->second;
      xfer[r][i] = std::max(0.0, end - last);
    }
  }
  for (int r = 0; r < t.world; ++r) {
    const auto &ev = t.ranks[r].events;
    double prevEnd = ev.empty() ? 0 : ev.front().gb;
    auto sc = rankScale.find(r);
    for (size_t i = 0; i < ev.size(); ++i) {
      const Event &e = ev[i];
      SimOp op;
      op.name = e.name;
      op.cat = e.cat;
      op.op = e.op;
      op.step = e.step;
      op.mb = e.mb;
      op.layer = e.layer;
      op.chunk = e.chunk;
      op.bytes = e.bytes;
      op.srcId = e.id;
      // Host gaps are kept; overlapping events keep their relative start.
      op.gapNs = e.gb - prevEnd;
      prevEnd = e.ge;
      switch (kind[r][i]) {
      case 0:
        op.kind = SimOp::Compute;
        op.durNs = e.ge - e.gb;
        if (sc != rankScale.end() && e.cat != Cat::Comm)
          op.durNs *= sc->second;
        break;
      case 1:
        op.kind = SimOp::Send;
        op.peer = e.peer;
        op.tag = e.tag;
        op.xferNs = xfer[r][i];
        break;
      case 2:
        op.kind = SimOp::Recv;
        op.peer = e.peer;
        op.tag = e.tag;
        break;
      default:
        op.kind = SimOp::Coll;
        op.group = grp[r][i];
        op.seq = e.seq;
        op.xferNs = xfer[r][i];
      }
      job.programs[r].push_back(op);
    }
  }
  return job;
}

bool mapp::scan::whatIf(const Trace &t, const Matches &m, const Diagnosis &d,
                        WhatIfResult &out, std::string *error) {
  SimNetwork net; // every transfer time is fixed: the model is never asked
  net.p2p = [](int, int, uint64_t) { return 0.0; };
  net.coll = [](const SimGroup &, Op, uint64_t) { return 0.0; };
  auto mean = [](const std::vector<double> &v) {
    return v.empty() ? 0.0
                     : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  };
  SimTimes base, fixed;
  SimJob j0 = traceToJob(t, m, d, {});
  if (!runSim(j0, net, base, error))
    return false;
  SimJob j1 = traceToJob(t, m, d, d.findings);
  if (!runSim(j1, net, fixed, error))
    return false;
  out.measuredStepMs = mean(d.stepNs) * 1e-6;
  out.replayStepMs = mean(stepTimesNs(j0, base)) * 1e-6;
  out.repairedStepMs = mean(stepTimesNs(j1, fixed)) * 1e-6;
  out.savedMs = out.replayStepMs - out.repairedStepMs;
  out.savedPct =
      out.replayStepMs > 0 ? 100 * out.savedMs / out.replayStepMs : 0;
  for (const Finding &f : d.findings)
    if (f.kind == "slow-rank" || f.kind == "slow-link") // not the routing
      out.repaired.push_back(
          f.kind == "slow-rank"
              ? "rank " + std::to_string(f.rank) + " compute at peers' median"
              : "link " + std::to_string(f.src) + "->" +
                    std::to_string(f.dst) + " at peer links' bandwidth");
  return true;
}

//===- SimSummaries.cpp - Live-monitor summaries of a simulated job -------===//
//
// Each rank's simulated ops go through the live monitor's Summarizer, as
// the runtime's trace records do, on the rank's own clock (its node's, as
// in the trace files): a receive carries the send call on the sender's
// clock and the payload's arrival on its own, as the runtime's do.
//
//===----------------------------------------------------------------------===//
#include "mapp/scan/Sim.h"

#include <cmath>
#include <map>
#include <set>

using namespace mapp::scan;
using mapp::monitor::StepSummary;
using mapp::monitor::SummaryEvent;

bool mapp::scan::simSummaries(const SimConfig &c, const SimJob &job,
                              const SimTimes &times,
                              std::vector<StepSummary> &out,
                              std::string *error) {
  if (times.ops.size() != job.programs.size() ||
      times.recvs.size() != job.programs.size()) {
    if (error)
      *error = "simSummaries: times do not match the job";
    return false;
  }
  int steps = 0;
  for (const auto &prog : job.programs)
    for (const SimOp &op : prog)
      steps = std::max(steps, op.step + 1);
  std::vector<SimClock> clocks = makeClocks(c);
  auto clockOf = [&](int r, double t) {
    const SimClock &k = clocks[r];
    return static_cast<uint64_t>(
        std::llround(k.offsetNs + (1 + k.driftPpm * 1e-6) * t));
  };
  int gpn = c.gpusPerNode > 0 ? c.gpusPerNode : c.tp;
  std::vector<std::vector<StepSummary>> perRank(job.world);
  for (int r = 0; r < job.world; ++r) {
    mapp::monitor::Summarizer sum;
    sum.setIdentity(r, r % c.tp, (r / c.tp) % c.dp, r / (c.tp * c.dp),
                    "sim-node" + std::to_string(r / gpn));
    std::vector<std::pair<size_t, size_t>> ops = job.opsOf(r);
    std::set<int> used; // the rank's own groups (a large job has thousands)
    for (auto [p, i] : ops)
      if (job.programs[p][i].kind == SimOp::Coll)
        used.insert(job.programs[p][i].group);
    for (int g : used) {
      std::vector<int> members; // ranks, not their streams' programs
      for (int m : job.groups[g].members)
        members.push_back(job.ownerOf(m));
      sum.setGroupKind(g, job.groups[g].kind, members);
    }
    sum.setLayout(c.tp, c.dp, c.pp);
    std::map<size_t, size_t> nextStamp; // program -> its next recv stamp
    for (auto [p, i] : ops) { // every stream of the rank
      const SimOp &op = job.programs[p][i];
      if (op.streamSync)
        continue; // a wait between the rank's streams, not an event
      auto [b, e] = times.ops[p][i];
      SummaryEvent ev;
      ev.track = mapp::monitor::trackOf(job.streamOf(p).c_str());
      ev.name = op.name.c_str();
      ev.step = op.step;
      ev.cat = op.cat;
      ev.op = op.op;
      ev.group = op.kind == SimOp::Coll ? op.group : -1;
      ev.seq = op.kind == SimOp::Coll ? op.seq : -1;
      ev.peer = op.peer < 0 ? -1 : job.ownerOf(op.peer);
      ev.bytes = op.bytes;
      ev.beginNs = clockOf(r, b);
      ev.endNs = clockOf(r, e);
      if (op.kind == SimOp::Recv) {
        const std::vector<SimRecvStamp> &stamps = times.recvs[p];
        size_t &k = nextStamp[p];
        while (k < stamps.size() && stamps[k].op < i)
          ++k; // the stream waits skipped above
        if (k >= stamps.size() || stamps[k].op != i) {
          if (error)
            *error = "simSummaries: recv " + std::to_string(i) + " of rank " +
                     std::to_string(r) + " has no message";
          return false;
        }
        ev.sentNs = clockOf(ev.peer, stamps[k].sentNs);
        ev.arrivedNs = clockOf(r, stamps[k].arrivedNs);
      }
      sum.add(ev);
    }
    for (int s = 0; s < steps; ++s)
      perRank[r].push_back(sum.take(s));
  }
  out.reserve(out.size() + static_cast<size_t>(steps) * job.world);
  for (int s = 0; s < steps; ++s)
    for (int r = 0; r < job.world; ++r)
      out.push_back(perRank[r][s]);
  return true;
}

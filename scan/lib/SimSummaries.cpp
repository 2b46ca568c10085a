//===- SimSummaries.cpp - Live-monitor summaries of a simulated job -------===//
//
// Each rank's simulated ops go through the live monitor's Summarizer, as
// the runtime's trace records do. A receive's wire time: from the matching
// send's begin to the payload's arrival -- the receive's end when it
// waited (the engine ends a receive at max(posted, arrival)), else the
// end of a blocking send (it ends on arrival); an early payload for a
// non-blocking send has no known arrival and gives no wire sample.
//
//===----------------------------------------------------------------------===//
#include "mapp/scan/Sim.h"

#include <deque>
#include <map>
#include <tuple>

using namespace mapp::scan;
using mapp::monitor::StepSummary;
using mapp::monitor::SummaryEvent;

bool mapp::scan::simSummaries(const SimConfig &c, const SimJob &job,
                              const SimTimes &times,
                              std::vector<StepSummary> &out,
                              std::string *error) {
  if (times.ops.size() != job.programs.size()) {
    if (error)
      *error = "simSummaries: times do not match the job";
    return false;
  }
  // Sends by (src, dst, tag) in issue order: the non-overtaking match.
  struct SendTimes {
    double begin, end;
    bool async;
  };
  std::map<std::tuple<int, int, int64_t>, std::deque<SendTimes>> sends;
  int steps = 0;
  for (int r = 0; r < static_cast<int>(job.programs.size()); ++r)
    for (size_t i = 0; i < job.programs[r].size(); ++i) {
      const SimOp &op = job.programs[r][i];
      steps = std::max(steps, op.step + 1);
      if (op.kind == SimOp::Send && !op.streamSync)
        sends[{r, op.peer, op.tag}].push_back(
            {times.ops[r][i].first, times.ops[r][i].second, op.async});
    }
  int gpn = c.gpusPerNode > 0 ? c.gpusPerNode : c.tp;
  std::vector<std::vector<StepSummary>> perRank(job.world);
  for (int r = 0; r < job.world; ++r) {
    mapp::monitor::Summarizer sum;
    sum.setIdentity(r, r % c.tp, (r / c.tp) % c.dp, r / (c.tp * c.dp),
                    "sim-node" + std::to_string(r / gpn));
    for (size_t g = 0; g < job.groups.size(); ++g)
      sum.setGroupKind(static_cast<int>(g), job.groups[g].kind);
    sum.setLayout(c.tp, c.dp, c.pp);
    for (auto [p, i] : job.opsOf(r)) { // every stream of the rank
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
      ev.peer = op.peer < 0 ? -1 : job.ownerOf(op.peer);
      ev.bytes = op.bytes;
      ev.beginNs = static_cast<uint64_t>(b);
      ev.endNs = static_cast<uint64_t>(e);
      if (op.kind == SimOp::Recv) {
        auto &q = sends[{op.peer, static_cast<int>(p), op.tag}];
        if (q.empty()) {
          if (error)
            *error = "simSummaries: recv of rank " + std::to_string(r) +
                     " from " + std::to_string(op.peer) + " has no send";
          return false;
        }
        SendTimes s = q.front();
        q.pop_front();
        double arrived = e > b ? e : s.async ? -1 : s.end;
        if (arrived > s.begin) {
          ev.sentNs = static_cast<uint64_t>(s.begin);
          ev.arrivedNs = static_cast<uint64_t>(arrived);
        } else {
          ev.wireUnknown = true;
        }
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

//===- Consistency.cpp - errors and problems that void a diagnosis --------===//

#include "mapp/scan/Consistency.h"

#include <algorithm>
#include <map>
#include <numeric>

using namespace mapp::scan;

static std::string fileOf(const RankTrace &rt) {
  return rt.path.substr(rt.path.rfind('/') + 1);
}

Consistency mapp::scan::checkConsistency(const Trace &t, const Matches &m,
                                         const AlignResult &a,
                                         const Diagnosis &d,
                                         const ConsistencyOptions &opts) {
  Consistency c;
  // Two real ranks' clocks never agree to the nanosecond on every event:
  // equal (b, e) sequences are one rank's events copied under another's
  // header (Trace.cpp catches the copy by its groups unless the two ranks
  // share every group). A noise-free simulation can do it too, so this only
  // withholds the findings.
  std::map<uint64_t, int> seen;
  for (int r = 0; r < t.world; ++r) {
    const std::vector<Event> &ev = t.ranks[r].events;
    if (ev.size() < 4)
      continue;
    uint64_t h = 1469598103934665603ull; // FNV-1a over the timestamps
    for (const Event &e : ev)
      for (int64_t v : {e.b, e.e})
        h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    auto [it, fresh] = seen.emplace(h, r);
    if (!fresh)
      c.problems.push_back(fileOf(t.ranks[r]) + " holds the same " +
                           std::to_string(ev.size()) +
                           " event times, to the ns, as " +
                           fileOf(t.ranks[it->second]) +
                           ": one rank's events under another rank's header?");
  }

  size_t missingFooter = 0;
  std::string footerless;
  int64_t dropped = 0;
  for (const RankTrace &rt : t.ranks) {
    dropped += rt.dropped;
    if (!rt.hasFooter) {
      footerless += (missingFooter++ ? ", " : "") + fileOf(rt);
    }
  }
  if (missingFooter)
    c.problems.push_back(std::to_string(missingFooter) +
                         " trace(s) not closed (no footer: crashed or cut "
                         "short): " +
                         footerless);
  if (dropped)
    c.problems.push_back("the recorders dropped " + std::to_string(dropped) +
                         " events");
  if (m.incompleteColls)
    c.problems.push_back(
        std::to_string(m.incompleteColls) + " of " +
        std::to_string(m.incompleteColls + m.colls.size()) +
        " collectives are incomplete (some member has no record of them): a "
        "truncated trace or lost events");
  if (m.unmatchedSends || m.unmatchedRecvs)
    c.problems.push_back(std::to_string(m.unmatchedSends) +
                         " sends and " + std::to_string(m.unmatchedRecvs) +
                         " receives have no partner");

  double meanStep =
      d.stepNs.empty() ? 0
                       : std::accumulate(d.stepNs.begin(), d.stepNs.end(), 0.0) /
                             d.stepNs.size();
  char buf[256];
  if (!opts.checkAlignment)
    return c;
  const bool oneClock = a.sharedClocks + 1 >= t.ranks.size();
  const double residualLimit =
      oneClock ? std::max(opts.sharedClockStepFraction * meanStep,
                          opts.sharedClockJitterNs)
               : opts.maxResidualFraction * meanStep;
  if (meanStep > 0 && a.collRmsNs > residualLimit) {
    std::snprintf(buf, sizeof buf,
                  "alignment residual %.3f ms rms (max %.3f ms) is %.1f%% of "
                  "the mean step (limit %.1f%%%s): the ranks' clocks do not "
                  "fit one timeline",
                  a.collRmsNs * 1e-6, a.collMaxNs * 1e-6,
                  100 * a.collRmsNs / meanStep,
                  100 * residualLimit / meanStep,
                  oneClock ? ", one host clock: wake-up jitter allowed"
                           : "");
    c.problems.push_back(buf);
  }
  double violLimit =
      std::max(1.0, opts.maxViolationFraction * double(a.p2pPairs));
  if (double(a.violationsAfter) > violLimit) {
    std::snprintf(buf, sizeof buf,
                  "%zu of %zu receives end before their send began, after "
                  "alignment (limit %.0f): the events are not causally "
                  "consistent",
                  a.violationsAfter, a.p2pPairs, violLimit);
    c.problems.push_back(buf);
  }
  return c;
}

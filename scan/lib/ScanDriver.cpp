//===- ScanDriver.cpp - mapp-scan's modes as one library function ---------===//
//
// Replay of recorded summaries, --follow of growing traces, and the offline
// pipeline: read -> match -> align -> diagnose -> check -> what-if -> write.
// tools/mapp-scan parses the flags and calls runScanRequest.
// See docs/mapp-scan.md.
//
//===----------------------------------------------------------------------===//
#include "mapp/scan/ScanDriver.h"
#include "mapp/scan/Decisions.h"

#include <cstdio>
#include <fstream>
#include <memory>

using namespace mapp::scan;

namespace {

int failWith(std::string *err, const std::string &msg) {
  if (err)
    *err = msg;
  return 1;
}

} // namespace

int mapp::scan::runScanRequest(ScanRequest r, std::string *err) {
  std::string why;
  if (!r.decisions.empty() && (!r.replay.empty() || r.followMode))
    return failWith(err, "--decisions goes into the report of a trace "
                         "directory, not --follow or --replay-summaries");
  if (!r.replay.empty()) {
    if (!r.dir.empty() || r.followMode)
      return failWith(err, "--replay-summaries takes no trace directory");
    std::vector<mapp::monitor::StepSummary> recs;
    ReplayStats st;

    if (!mapp::monitor::readSummaries(r.replay, recs, &why) ||
        !replaySummaries(recs, r.fo.diagnosis, st, &why))
      return failWith(err, why);
    std::unique_ptr<mapp::monitor::AlertLog> log =
        mapp::monitor::AlertLog::open(r.fo.alerts, "mapp-scan", &why);
    if (!log)
      return failWith(err, "--alerts: " + why);
    for (const mapp::monitor::Alert &a : st.alerts)
      log->write(a);
    std::fprintf(stderr,
                 "mapp-scan --replay-summaries: %d ranks, %d steps: per-step "
                 "diagnosis max %.1f ms, median %.1f ms; all steps %.2f s; "
                 "window memory %.1f MiB; %zu alert line(s)\n",
                 st.world, st.steps, st.maxStepMs, st.medianStepMs, st.totalS,
                 st.memoryBytes / 1048576.0, st.alerts.size());
    if (!st.exposure.empty())
      std::fprintf(stderr, "mapp-scan --replay-summaries: %s\n",
                   st.exposure.c_str());
    return 0;
  }

  if (r.followMode) {
    r.fo.dir = r.dir;
    FollowResult fr;

    if (!follow(r.fo, fr, &why))
      return failWith(err, why);
    if (!r.quiet) {
      std::fprintf(stderr,
                   "mapp-scan --follow: %d ranks, %lld steps diagnosed, %zu "
                   "alert line(s), window memory %.1f MiB%s\n",
                   fr.world, static_cast<long long>(fr.steps), fr.alerts,
                   fr.peakMemoryBytes / 1048576.0,
                   fr.complete ? ""
                               : "; stopped: nothing grew for the "
                                 "--follow-timeout");
      if (!fr.exposure.empty())
        std::fprintf(stderr, "mapp-scan --follow: %s\n", fr.exposure.c_str());
    }
    return 0;
  }
  if (!r.fo.alerts.empty() && r.fo.alerts != "-")
    return failWith(err, "--alerts needs --follow");

  ScanResult s;
  if (!readTraceDir(r.dir, r.ro, s.trace, &why))
    return failWith(err, why);
  if (!r.decisions.empty() && !readDecisions(r.decisions, s.decisions, &why))
    return failWith(err, why);
  for (int rank : r.co.ranks)
    if (rank >= s.trace.world)
      return failWith(err, "--ranks names rank " + std::to_string(rank) +
                               " but the world size is " +
                               std::to_string(s.trace.world));
  s.matches = matchEvents(s.trace);
  s.align = alignClocks(s.trace, s.matches, r.ao);
  s.diag = diagnose(s.trace, s.matches, r.dopt);
  s.exposure = analyzeExposure(s.trace, s.matches);
  s.classes = eventClassStats(s.trace, s.matches);
  r.copt.checkAlignment = r.ao.enabled;
  s.consistency = checkConsistency(s.trace, s.matches, s.align, s.diag, r.copt);
  if (!r.allowInconsistent)
    withholdFindings(s);
  if (r.doWhatIf) {
    if (!whatIf(s.trace, s.matches, s.diag, s.whatIf, &why))
      return failWith(err, "what-if replay: " + why);
    s.haveWhatIf = true;
  }
  if (!r.merged.empty()) {
    std::string note;
    if (!writeChromeTrace(s, r.co, r.merged, &note, &why))
      return failWith(err, why);
    if (!note.empty())
      std::fprintf(stderr, "mapp-scan: note: %s\n", note.c_str());
  }
  if (!r.report.empty()) {
    std::ofstream out(r.report);
    out << reportJson(s).dump(1) << "\n";
    if (!out)
      return failWith(err, r.report + ": cannot write");
  }
  if (!r.html.empty() && !writeHtmlReport(s, r.html, &why))
    return failWith(err, why);
  if (!r.quiet)
    std::fputs(textSummary(s).c_str(), stdout);
  if (s.consistency.consistent())
    return 0;
  for (const std::string &p : s.consistency.problems)
    std::fprintf(stderr, "mapp-scan: warning: inconsistent data: %s\n",
                 p.c_str());
  return r.allowInconsistent ? 0 : 3;
}

//===- Follow.h - mapp-scan --follow: diagnose traces as they grow -*- C++ -*-===//
//
// For a job that writes trace files (mapp-run --trace-dir, or any writer of
// docs/trace-format.md): DIR/rank-*.trace.jsonl are read as they grow, each
// rank's events are reduced to step summaries by the live monitor's
// Summarizer (a step is complete for a rank once an event of a later step
// or its footer appears) and diagnosed by the same WindowDiagnoser that
// mapp-run --monitor runs (mapp/monitor/Diagnoser.h). Stops when every rank
// file has its footer, or when no file grew for `idleTimeoutS`.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_FOLLOW_H
#define MAPP_SCAN_FOLLOW_H

#include "mapp/monitor/AlertLog.h"
#include "mapp/monitor/Diagnoser.h"

#include <string>

namespace mapp::scan {

struct FollowOptions {
  std::string dir;
  std::string alerts = "-"; // JSON lines; "-" = stdout
  double idleTimeoutS = 60; // stop when nothing grew this long
  double pollS = 0.1;
  monitor::MonitorOptions diagnosis;
};

struct FollowResult {
  int world = 0;
  int64_t steps = 0;        // steps diagnosed
  size_t alerts = 0;
  bool complete = false;    // every rank file ended with its footer
  std::vector<int> unfinished; // ranks without a footer (timeout)
  size_t peakMemoryBytes = 0; // the diagnoser's window
  std::string exposure;       // monitor::exposureText of the steps
};

/// Follows opts.dir until the exit condition; false with *error naming the
/// file (and line) on bad input: an unreadable or corrupt file, a rank or
/// world that does not fit, no rank file within idleTimeoutS.
bool follow(const FollowOptions &opts, FollowResult &out, std::string *error);

/// The monitor rank's work on recorded summaries (mapp-sim --summaries):
/// each step's records go to a WindowDiagnoser as they would arrive, and
/// the time of each step's add + diagnosis is measured.
struct ReplayStats {
  int world = 0, steps = 0;
  double maxStepMs = 0, medianStepMs = 0, totalS = 0;
  size_t memoryBytes = 0;
  std::vector<monitor::Alert> alerts;
  std::string exposure; // monitor::exposureText of the steps
};
bool replaySummaries(const std::vector<monitor::StepSummary> &records,
                     const monitor::MonitorOptions &opts, ReplayStats &out,
                     std::string *error);

} // namespace mapp::scan

#endif

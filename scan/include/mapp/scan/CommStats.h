//===- CommStats.h - Exposed communication, critical path, classes -*- C++ -*-===//
//
// On an aligned trace (Event::gb/ge set), see docs/mapp-scan.md:
//  - exposed communication: per rank, class and step, the part of each
//    communication event with none of the rank's compute beside it
//    (mapp/monitor/Exposure.h, shared with the live monitor and mapp-sim);
//  - the critical path of each step, walked back from the step's last
//    event through the waits (a receive to its sender, a collective to
//    its last member to arrive), split into compute, communication per
//    class and the rest;
//  - per-rank statistics per event class (forward, backward, optimizer,
//    data, each collective group kind, transfers by direction), with the
//    slowest rank named per class.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_COMMSTATS_H
#define MAPP_SCAN_COMMSTATS_H

#include "mapp/monitor/Exposure.h"
#include "mapp/scan/Trace.h"

#include <map>
#include <string>
#include <vector>

namespace mapp::scan {

using mapp::monitor::kCommClasses;

struct ClassExposure {
  double commNs = 0, exposedNs = 0; // over all steps
  size_t events = 0;
};

struct RankExposure {
  int rank = 0;
  ClassExposure cls[kCommClasses];
  double commNs = 0, exposedNs = 0; // all classes, all steps
  std::vector<double> stepExposedNs; // per step (ExposureAnalysis::stepIds)
};

struct CriticalPathStep {
  int step = -1;
  double stepNs = 0;    // from the previous step's end to this one's
  double computeNs = 0; // compute on the path
  double commNs[kCommClasses] = {}; // communication on the path
  double otherNs = 0;   // between events (host work, idle)
  int endRank = -1;     // the rank that ended the step
  int rankSwitches = 0; // waits the path went through to another rank
  double totalCommNs() const;
};

struct ExposureAnalysis {
  std::vector<int> stepIds;         // steps with events, ascending
  std::vector<RankExposure> ranks;  // index = rank
  std::vector<CriticalPathStep> path; // per step (stepIds)
};

/// The communication class of one of rank r's events (-1: not
/// communication).
int commClassOf(const Trace &t, int r, const Event &e);

ExposureAnalysis analyzeExposure(const Trace &t, const Matches &m);

/// Per-rank statistics of one event class.
struct RankClassStats {
  int rank = 0;
  size_t events = 0;
  double minNs = 0, maxNs = 0, meanNs = 0, p95Ns = 0; // per event
  double perStepNs = 0; // the class's time per step on this rank
};

struct ClassStats {
  std::string name; // forward, backward, ..., tp, dp, ..., send-forward, ...
  bool comm = false;
  std::vector<RankClassStats> ranks; // ranks with events of the class
  int slowestRank = -1;              // most time per step in the class
  double slowestRatio = 1;           // its time / the ranks' median
  // Communication: the rank the others waited for -- credited per
  // collective with how long the others waited for its arrival (the last
  // arrival minus the median one), per receive with how long the receiver
  // waited for its send; -1 when no one waited.
  int lateRank = -1;
  double lateNsPerStep = 0;
};

std::vector<ClassStats> eventClassStats(const Trace &t, const Matches &m);

/// Nearest-rank percentile of v (q in [0, 1]); 0 for an empty v.
double nearestRankPercentile(std::vector<double> v, double q);

} // namespace mapp::scan

#endif // MAPP_SCAN_COMMSTATS_H

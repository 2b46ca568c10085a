//===- Diagnoser.h - Slow-rank / slow-link verdicts over a window -*- C++ -*-===//
//
// The one diagnosis of MegaScan live: used by `mapp-run --monitor` (the
// monitor rank feeds it the summaries gathered over the job's
// communicator), by `mapp-scan --follow` (summaries of growing trace files)
// and by the scale benchmark (summaries of a simulated 16,384-rank job).
//
// The method is mapp-scan's (docs/mapp-scan.md, "Diagnosis") on summaries:
// a slow rank's own compute is slower than its peers' (ranks of the same
// role: same pipeline stage, same op mix), its victims only wait longer; a
// slow link's fastest transfer of the step is slower than the other links
// of its class (same host relation, direction, message size). Each step
// gives a verdict per rank and link; an alert needs `alertAfter` slow steps
// in a row, a `recovered` line `recoverAfter` normal ones. The noise bar is
// the robust spread over the window. See docs/mapp-scan.md ("Live monitor").
//
// Memory: window x world summaries plus window doubles per rank and per
// link, independent of the job's length (memoryBytes()).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_DIAGNOSER_H
#define MAPP_MONITOR_DIAGNOSER_H

#include "mapp/monitor/DiagnosisCore.h"
#include "mapp/monitor/Summary.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mapp::monitor {

struct MonitorOptions {
  int window = 8;              // steps of summaries and verdicts kept
  double rankThreshold = 0.3;  // slow: compute >= (1 + t) x role peers
  // CPU time compared across processes (MPI ranks) carries each process's
  // placement and memory layout (up to 1.72x between healthy MPI ranks,
  // docs/mapp-scan.md "Compute clock"): the bar there.
  bool ranksAreProcesses = false;
  double processRankThreshold = kProcessRankThreshold;
  // A rank whose host ran more ranks than CPUs (StepSummary::BusyHost):
  // its CPU time carries the contention; mapp-scan's busy-host bar.
  double busyHostRankThreshold = kBusyHostRankThreshold;
  double linkThreshold = kLinkThreshold; // slow: fastest transfer >= ref / (1 - t)
  double minLinkExcessNs = 500e3; // ... and at least this much above ref
  int alertAfter = 3;          // slow steps in a row before an alert
  int strongAlertAfter = 2;    // ... when each is slow by twice the bar
  int recoverAfter = 2;        // normal steps in a row before `recovered`
  int warmupSteps = 2;         // first steps not judged (first touch)
  int missingAfter = 3;        // a rank this many steps behind: missing
  double throttledClock = 0.9; // SM clock below this x peers': throttled
  /// mapp-run --monitor-cost N: windows of N steps alternate unmonitored
  /// and monitored (0: all monitored). Unmonitored steps have no summaries
  /// and are not diagnosed, nor their ranks named missing.
  int costWindow = 0;
  /// Whether `step` is monitored: the odd windows (the first, with the
  /// run's warm-up, is not). Alike on every rank.
  bool observes(int64_t step) const {
    return costWindow <= 0 || (step / costWindow) % 2 == 1;
  }
};

struct Alert {
  std::string kind;  // slow-rank | slow-link | missing-summaries | recovered
  int64_t step = -1; // the step of the verdict
  int64_t since = -1; // first step of the fault
  int rank = -1, src = -1, dst = -1;
  std::string of;    // recovered: the kind that ended
  double confidence = 0;
  double ratio = 1;  // slow-rank: compute / peers; slow-link: wire / peers
  std::string cause; // slow-rank: clock-throttled | compute
  std::vector<std::pair<std::string, double>> evidence;
  std::vector<int> victims;
  std::string text; // one line for people
};

/// NVML throttle-reason bits that slow the SM clock (not idle, not the
/// application clock setting): SW power cap, HW slowdown, SW thermal, HW
/// thermal, HW power brake.
constexpr uint64_t kThrottleSlowingMask = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
std::string throttleReasonNames(uint64_t bits);

/// Exposed communication (Exposure.h) summed over the diagnosed steps.
struct ExposureTotals {
  int64_t steps = 0;     // steps diagnosed
  int64_t summaries = 0; // rank-steps summed below
  double exposedNs[kCommClasses] = {}, commNs[kCommClasses] = {};
  double spanNs = 0;                 // sum of the ranks' step spans
  std::vector<double> rankExposedNs; // per rank, over its steps
  std::vector<int64_t> rankSteps;
};
/// One line: exposed communication per rank and step, its share of the
/// step, per class, and the most exposed rank ("" before any step).
std::string exposureText(const ExposureTotals &t);

class WindowDiagnoser {
public:
  explicit WindowDiagnoser(int world, MonitorOptions opts = {});
  /// One rank's summary (any order). A step already diagnosed, or a rank
  /// outside the world, is ignored (returns false).
  bool add(const StepSummary &s);
  /// Diagnoses, in order, every step that each reporting rank delivered
  /// (and steps a rank stopped delivering: that rank is named once).
  std::vector<Alert> poll();
  /// The end of the job: diagnoses what remains with whoever reported and
  /// names the ranks that never delivered the last steps.
  std::vector<Alert> finish();
  /// Steps below this are diagnosed.
  int64_t nextStep() const { return next_; }
  /// A run resumed at `step` (before any summary): its first step, so the
  /// steps before it are not waited for, nor their ranks named missing.
  void startAt(int64_t step) {
    if (newest_ < 0)
      next_ = step;
  }
  int world() const { return world_; }
  /// Bytes held: bounded by the window, independent of the run's length.
  size_t memoryBytes() const;
  const MonitorOptions &options() const { return opts_; }
  /// Exposed communication over every step diagnosed so far.
  const ExposureTotals &exposure() const { return exposure_; }

private:
  struct Track { // one rank or link's run of verdicts
    int slowRun = 0, strongRun = 0, normalRun = 0;
    bool alerted = false;
    int64_t since = -1;
    double minRatio = 0;
  };
  void diagnoseStep(int64_t step, std::vector<Alert> &out);
  void judgeRanks(int64_t step, const std::vector<const StepSummary *> &got,
                  std::vector<Alert> &out);
  void judgeLinks(int64_t step, const std::vector<const StepSummary *> &got,
                  std::vector<Alert> &out);
  /// Applies one verdict to a track (`strong`: slow by twice the bar);
  /// true when it turns into an alert or a recovery.
  bool advance(Track &t, bool slow, bool strong, bool normal, double ratio,
               int64_t step);
  size_t slot(int64_t step, int rank) const {
    return static_cast<size_t>(step % opts_.window) * world_ + rank;
  }

  int world_;
  MonitorOptions opts_;
  int64_t next_ = 0;     // oldest step not yet diagnosed
  int64_t newest_ = -1;  // newest step any rank delivered
  std::vector<StepSummary> ring_;   // window x world
  std::vector<int64_t> ringStep_;   // step held in each slot (-1: none)
  std::vector<int64_t> lastStep_;   // per rank: newest step delivered
  std::vector<char> missing_;       // per rank: declared missing
  std::vector<double> rankHistory_; // window x world compute ratios (0: none)
  std::vector<Track> rankTracks_;
  struct LinkWindow { // a link's fastest transfer per step (ns; -1: none)
    std::vector<double> hi; // what it took at most
    std::vector<double> lo; // ... and at least (0: no lower bound)
  };
  std::map<std::pair<int, int>, LinkWindow> linkHistory_;
  std::map<std::pair<int, int>, Track> linkTracks_;
  std::vector<Alert> pending_;
  ExposureTotals exposure_;
};

} // namespace mapp::monitor

#endif // MAPP_MONITOR_DIAGNOSER_H

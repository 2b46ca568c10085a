//===- Consistency.h - Is the merged trace fit for a diagnosis? -*- C++ -*-===//
//
// A diagnosis is only as good as its data: a file from another run, a trace
// cut short, lost events or clocks that do not align make the comparison of
// ranks meaningless, and a confident "slow-rank" on such data is worse than
// none. checkConsistency() lists what is wrong; mapp-scan then withholds the
// findings (docs/mapp-scan.md, "Consistency").
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_CONSISTENCY_H
#define MAPP_SCAN_CONSISTENCY_H

#include "mapp/scan/Align.h"
#include "mapp/scan/Diagnose.h"

namespace mapp::scan {

struct ConsistencyOptions {
  /// Alignment residual (rms at collective anchors) above this share of the
  /// mean step time: the ranks' clocks do not fit one timeline.
  double maxResidualFraction = 0.05;
  /// When every rank reads one host's clock nothing can drift, and the
  /// residual is only the threads' wake-up jitter at collective exits: up
  /// to this much rms is accepted whatever the step (a busy 2-core host
  /// reached 0.8 ms on 10 ms steps; a foreign run's events are seconds off).
  double sharedClockJitterNs = 5e6;
  /// Receives ending before their send began, after repair, above this
  /// share of the matched pairs (and above 1).
  double maxViolationFraction = 0.01;
  /// Off with --no-align: wall clocks are not expected to fit.
  bool checkAlignment = true;
};

/// What cannot be one run's trace at all (files of different runs, a group
/// without the file's rank) is an error of readTraceDir; this is what is
/// readable but too incomplete or incoherent to diagnose.
struct Consistency {
  std::vector<std::string> problems;
  bool consistent() const { return problems.empty(); }
};

Consistency checkConsistency(const Trace &t, const Matches &m,
                             const AlignResult &a, const Diagnosis &d,
                             const ConsistencyOptions &opts);

} // namespace mapp::scan

#endif // MAPP_SCAN_CONSISTENCY_H

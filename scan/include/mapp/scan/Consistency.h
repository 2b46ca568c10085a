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
  /// When every rank reads one host's clock nothing can drift: the fit is
  /// exact by construction and the residual is only the ranks' wake-up
  /// jitter at collective exits, which grows with the host's load, not with
  /// any clock error (2 MPI processes on CI's 2 busy cores: 5.6 ms rms,
  /// 16.9 ms max on 102 ms steps). What the residual can still reveal there
  /// is collectives matched to the wrong instance, off by a sizeable part
  /// of a step, so the limit is the larger of this fraction of the mean
  /// step and the absolute floor below (for steps of a few ms).
  double sharedClockStepFraction = 0.5;
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

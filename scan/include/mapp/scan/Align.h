//===- Align.h - Cross-rank clock alignment ---------------------*- C++ -*-===//
//
// Each rank's monotonic clock is mapped onto one global timeline (rank 0's
// clock) by G_r(x) = (x - origin_r) * (1 + drift_r) + offset_r, fitted by
// least squares on anchors:
//  * members of a collective leave it together: their end times are equal;
//  * ranks not linked by any collective are tied by send/recv pairs in both
//    directions, NTP-style: the fastest A->B and B->A transfers of a step
//    are assumed equally long;
//  * constraint repair: a receive cannot end before its send began; pairs
//    that still violate this become equations and the fit is repeated.
//  * ranks of one host reading its monotonic clock (header clock "steady")
//    share one mapping;
// Weak priors from the headers' wall clocks keep isolated ranks defined.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_ALIGN_H
#define MAPP_SCAN_ALIGN_H

#include "mapp/scan/Trace.h"

namespace mapp::scan {

struct RankClock {
  double originNs = 0; // the rank's first timestamp (local clock)
  double offsetNs = 0; // global time of originNs
  double driftPpm = 0; // local clock rate error relative to rank 0
  double collRmsNs = 0, collMaxNs = 0; // residuals at collective anchors
  size_t anchors = 0;
  double map(double localNs) const {
    return (localNs - originNs) * (1 + driftPpm * 1e-6) + offsetNs;
  }
};

struct AlignOptions {
  bool enabled = true;  // false: use header wall clocks only
  bool fitDrift = true; // false: offsets only
};

struct AlignResult {
  std::vector<RankClock> clocks;
  size_t collAnchors = 0, p2pPairs = 0, ntpEquations = 0;
  size_t violationsBefore = 0, violationsAfter = 0, repairRounds = 0;
  int components = 0; // groups of ranks connected by collectives
  size_t sharedClocks = 0; // ranks tied to an earlier rank's host clock
  double collRmsNs = 0, collMaxNs = 0;
  std::string method;
};

/// Fits the clocks and fills Event::gb/ge of every event.
AlignResult alignClocks(Trace &t, const Matches &m, const AlignOptions &opts);

} // namespace mapp::scan

#endif // MAPP_SCAN_ALIGN_H

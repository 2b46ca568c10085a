//===- DiagnosisCore.h - shared by mapp-scan and the monitor ----*- C++ -*-===//
//
// The statistics, bars and link classes of MegaScan's diagnosis, defined
// once: mapp-scan's offline diagnosis (scan/lib/Diagnose*.cpp) and the
// live window diagnosis (monitor/Diagnoser*.cpp) judge ranks and links by
// the same rules (docs/mapp-scan.md, "Diagnosis" and "Live monitor") over
// different evidence (whole traces vs a window of step summaries).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_DIAGNOSISCORE_H
#define MAPP_MONITOR_DIAGNOSISCORE_H

#include <cstddef>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace mapp::monitor {

//===-- Statistics --------------------------------------------------------===//

/// The median (of an even count, the mean of the two middle values); 0 for
/// none.
double median(std::vector<double> v);
/// The value at quantile q in [0, 1] (nearest rank); 0 for none.
double percentile(std::vector<double> v, double q);
/// What a set of peers' values says is normal: their median, but with only
/// two the smaller (a median of two cannot say which is the outlier),
/// unless `symmetric` (then their mean). 0 for none.
double peerReference(std::vector<double> v, bool symmetric = false);
/// The robust spread of v: 1.4826 x the median absolute deviation from
/// the median (the standard deviation for normal noise), at least `floor`
/// (and `floor` for none).
double robustSpread(const std::vector<double> &v, double floor);

//===-- Bars --------------------------------------------------------------===//

// A slow rank's compute exceeds its peers' by more than this many noise
// spreads (the rank ratios' robust spread).
constexpr double kRankNoiseSpreads = 5;
// CPU time compared across processes carries each process's placement and
// memory layout (healthy MPI ranks up to 1.72x apart, docs/mapp-scan.md
// "Compute clock"): a slow rank there is at least 2x its peers.
constexpr double kProcessRankThreshold = 1.0;
// On a host running more threads than cores CPU time carries the
// contention too (healthy ranks up to 1.31x): the bar there is 1.5x.
constexpr double kBusyHostRankThreshold = 0.5;
// A slow link moves its messages at most (1 - t) x its peer links' speed.
constexpr double kLinkThreshold = 0.3;
// A link class's noise is at least this share of its reference.
constexpr double kLinkNoiseFloor = 0.02;

/// How far a rank's compute ratio (its time / its peers') is into the
/// slow range, 0 to 1 (1 at twice the threshold `t`).
double rankSlowness(double ratio, double t);
/// The transfer time a link must reach to be slow, against its class's
/// reference `refNs` and noise `noiseNs`: (1 / (1 - t)) x the reference,
/// `minExcessNs` above it, and three noise excursions above it, whichever
/// is highest.
double linkSlowBar(double refNs, double t, double noiseNs, double minExcessNs);
/// A slow link's confidence, 0 to 1: how much of its speed it lost (at 2 t:
/// 1) x how far `excessNs` stands out of the class's noise (6 excursions:
/// 1).
double linkConfidence(double refNs, double transferNs, double excessNs,
                      double noiseNs, double t);

//===-- Link classes ------------------------------------------------------===//

/// The pipeline direction of a link from its ends' stages: +1 forward, -1
/// backward, 0 other. With `stages` > 2 known, the last stage to the first
/// is forward (interleaved schedules wrap around); 0: unknown.
int pipelineDirection(int srcStage, int dstStage, int stages);

/// Links grouped by what makes their transfers comparable: the same host
/// relation, message size and pipeline direction; a link whose class has
/// fewer than three links falls back to (host, size), then to the host
/// relation alone, since a median of two cannot tell the outlier.
class LinkClasses {
public:
  /// Adds link number size() (the caller's index).
  void add(bool intraHost, double bytes, int direction);
  size_t size() const { return links_.size(); }
  /// The class link `i` is judged in: the indices of its members, `i`
  /// among them (one vector per class: its address names the class).
  const std::vector<size_t> &classOf(size_t i) const;

private:
  using Key = std::tuple<int, bool, double, int>; // level, host, bytes, dir
  static Key keyOf(int level, bool intra, double bytes, int dir);
  std::vector<std::tuple<bool, double, int>> links_;
  std::map<Key, std::vector<size_t>> classes_;
};

} // namespace mapp::monitor

#endif

//===- Diagnose.h - Slow-rank and slow-link diagnosis -----------*- C++ -*-===//
//
// Works on an aligned trace (Event::gb/ge set). See docs/mapp-scan.md for
// the method and what the confidence means.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_DIAGNOSE_H
#define MAPP_SCAN_DIAGNOSE_H

#include "mapp/monitor/DiagnosisCore.h"
#include "mapp/scan/Trace.h"
#include <set>

namespace mapp::scan {

struct RankStats {
  int rank = 0;
  double computeNs = 0; // compute, data, memcpy, optimizer (leaf events)
  double commNs = 0;    // time moving bytes (transfer part of comm events)
  double waitNs = 0;    // inside comm events, waiting for a peer to arrive
  double idleNs = 0;    // between events
  double spanNs = 0;
  // Own op durations / peers' reference: the least of the medians per op
  // and per compute time, over all ops and over lockstep ops
  // (docs/mapp-scan.md, "Slow rank").
  double computeRatio = 1;
  double consistency = 0; // share of those ops slower than 1 + threshold/2
  double kindRatioLowerQuartile = 1; // over op names of the name's ratio
  size_t compared = 0;
  // Share of its compute spans the rank's thread was off its core (wall
  // time without CPU time; -1: the trace has no CPU times).
  double offCpuFraction = -1;
};

struct LinkStats {
  int src = 0, dst = 0;
  bool intraHost = false;
  size_t messages = 0;
  uint64_t bytes = 0;
  double transferNs = 0; // median over steps of the step's fastest transfer
  double gbps = 0;        // typical message bytes / transferNs
  double ratio = 1;       // class reference transferNs / own (< 1: slower)
  double slowStepFraction = 0; // steps whose fastest transfer was slow
  size_t steps = 0;            // steps with a transfer on the link
  size_t peers = 0;            // links in the class it was compared with
  std::vector<size_t> pairs;   // indices into Matches::p2p
};

struct Finding {
  std::string kind; // slow-rank | slow-link | routing-imbalance
  int rank = -1, src = -1, dst = -1;
  double confidence = 0;
  // slow-rank: compute vs peers; slow-link: bw vs peers; routing-imbalance:
  // tokens received vs the ep group's mean
  double ratio = 1;
  std::string magnitude;
  std::vector<std::string> evidence; // "rank:id"
  std::vector<int> victims;
  // routing-imbalance: the ep group (member order; member j owns experts
  // [j E/n, (j+1) E/n)) and the bytes each member received
  std::vector<int> members;
  std::vector<double> memberBytes;

  /// Names a rank (slow-rank, routing-imbalance), not a link.
  bool aboutRank() const { return kind != "slow-link"; }
};

struct DiagnoseOptions {
  double rankThreshold = 0.10; // flag compute >= (1 + t) x peers' median
  double linkThreshold = mapp::monitor::kLinkThreshold; // flag bandwidth <= (1 - t) x peer links
  // A link compared with links of the other pipeline direction (its own
  // has fewer than three) must also be this much slower than them.
  double crossDirectionMinExcessNs = 1e6;
  // A link with an end on a host that ran more threads than cores must be
  // this much slower than its peers too: a transfer there (a memcpy of a
  // few microseconds between rank threads) takes what the sender's or the
  // receiver's scheduler adds, up to a time slice, and in every step when
  // the ranks' timing lines a wake-up up with it (a CI rehearsal: 7->3,
  // the reverse of a 5 ms delayed link, at 15-40 us against 3 us peers).
  double busyHostMinLinkExcessNs = 1e6;
  // A slow device slows nearly every op (87-100% in injected faults on a
  // busy 2-core host); a healthy rank disturbed by its host slows some
  // (57-60% in the false findings it caused): the share needed to name one.
  double minSlowOpShare = 0.75;
  // On a host that ran more runnable threads than cores (a rank of it off
  // its core for over a quarter of its compute), CPU time carries the
  // contention too (hypervisor steal, shared caches): healthy MPI ranks of
  // a 2-core VM running 8 measured up to 1.31x their peers' CPU time for
  // a whole run (docs/mapp-scan.md, "Slow rank"). The bar there.
  double busyHostRankThreshold = mapp::monitor::kBusyHostRankThreshold;
  // CPU time compared across processes (MPI ranks) carries each process's
  // own placement and memory layout: healthy MPI ranks of a 16-vCPU VM with
  // cores to spare measured up to 1.72x their peers' for a whole run (4 of
  // 20 clean runs over 1.5x); rank threads of one process stayed within
  // 1.08x there. The bar there; injected 5x slow ranks read 4.3-5.1x.
  double processRankThreshold = mapp::monitor::kProcessRankThreshold;
  size_t evidence = 6;
  // Compare compute by thread CPU time when the trace has it (false: by
  // span always, as before the traces carried CPU time).
  bool cpuClock = true;
  // routing-imbalance: an ep member received at least this x the group's
  // mean tokens (docs/mapp-scan.md, "Routing imbalance")
  double routingImbalance = 1.5;
};

struct Diagnosis {
  std::vector<RankStats> ranks;
  std::vector<LinkStats> links;
  std::vector<Finding> findings;
  std::vector<double> stepNs; // measured (aligned) step times
  double rankNoise = 0; // robust spread of compute ratios (symmetric refs)
  double linkNoise = 0; // largest link noise excursion / reference, over classes
  int steps = 0;
  // Compute ops compared by their thread CPU time (every leaf compute event
  // carries one): a rank descheduled by other work on its host is not slow.
  bool cpuClock = false;
  std::set<std::string> busyHosts; // ran more threads than cores
  std::vector<std::string> warnings;
};

Diagnosis diagnose(const Trace &t, const Matches &m,
                   const DiagnoseOptions &opts);

/// The slow-link part of diagnose(): fills d.links, d.linkNoise and appends
/// slow-link findings.
void diagnoseLinks(const Trace &t, const Matches &m,
                   const DiagnoseOptions &opts, Diagnosis &d);

/// Expert parallelism (DiagnoseRouting.cpp): appends routing-imbalance
/// findings; marks in `loadDependent` the compute events whose cost follows
/// the tokens routed to the rank (its experts' work), which the slow-rank
/// rule does not compare.
void diagnoseRouting(const Trace &t,
                     const std::vector<std::vector<char>> &container,
                     bool cpuClock, const DiagnoseOptions &opts, Diagnosis &d,
                     std::vector<std::vector<char>> &loadDependent);

using mapp::monitor::median; // the diagnosis core's (DiagnosisCore.h)
/// Median of (value, weight) pairs: the smallest value with at least half
/// the total weight at or below it (plain median if all weights are 0).
double weightedMedian(std::vector<std::pair<double, double>> v);

} // namespace mapp::scan

#endif // MAPP_SCAN_DIAGNOSE_H

//===- LinkMonitor.h - per-peer link speed from the transfers ---*- C++ -*-===//
//
// Every completed receive after the first step (the transports' warm-up)
// is a sample: transit = completedNs - sentNs (the
// sender's send time travels with the message) and bytes / transit. Per
// incoming peer an exponential average with weight `smoothing` (plan
// AdaptivePolicy.bandwidth_smoothing) and the best average seen. A link is
// slow when its average transit exceeds ratio x its best AND the excess is
// longer than one mean task: a delay shorter than a task any schedule hides,
// and over MPI a completion is only seen between tasks, so shorter excesses
// are measurement noise. The last kSlowRun transfers must each have been
// slow too: one message held up (a sender thread descheduled on a busy host
// between stamping and delivering it) lifts the average past both bars, a
// slow link delays every message. Hysteresis: a slow link counts as recovered only
// once its excess is below half of both bars, so noise around the bar does
// not flip the policy back and forth.
//
// The live monitor (mapp-run --monitor-to-dpp) is a second input: its
// slow-link verdicts over the job's summaries mark an incoming link slow
// until it reports the link recovered (docs/megadpp.md, "The monitor's
// verdicts").
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_SCHED_LINK_MONITOR_H
#define MAPP_RT_SCHED_LINK_MONITOR_H

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mapp::rt::sched {

class LinkMonitor {
public:
  LinkMonitor(double ratio, double smoothing)
      : ratio_(ratio), alpha_(smoothing) {}
  void sample(int peer, uint64_t bytes, uint64_t sentNs, uint64_t doneNs);
  void taskTime(double ns);
  /// The slowest incoming link that counts as slow; false if none. `why`
  /// then names it ("link 2->3 transit 21 ms, 40x its best 0.5 ms").
  bool slow(int self, std::string &why);
  /// The live monitor's verdict on the link from `peer` to this rank.
  void monitorVerdict(int peer, bool slow);
  std::vector<std::pair<int, double>> transitNs() const;
  std::vector<std::pair<int, double>> bytesPerS() const;

private:
  struct Link {
    double transit = 0, best = 0, bps = 0;
    int64_t n = 0;
    int slowRun = 0; // consecutive transfers slower than both bars
    bool slow = false;
  };
  static constexpr int kSlowRun = 3;
  double ratio_, alpha_;
  double taskNs_ = 0;
  std::map<int, Link> links_;
  std::map<int, bool> monitorSlow_; // peer -> the monitor's last verdict
};

} // namespace mapp::rt::sched

#endif

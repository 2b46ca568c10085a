//===- LinkMonitor.cpp ----------------------------------------------------===//
#include "LinkMonitor.h"

#include <algorithm>
#include <cstdio>
#include <string>

using namespace mapp::rt::sched;

void LinkMonitor::sample(int peer, uint64_t bytes, uint64_t sentNs,
                         uint64_t doneNs) {
  if (!sentNs || !doneNs)
    return;
  // Clocks of different hosts may disagree; a negative transit is noise.
  double t = doneNs > sentNs ? static_cast<double>(doneNs - sentNs) : 0;
  Link &l = links_[peer];
  l.slowRun = l.n && t > ratio_ * l.best && t - l.best > taskNs_
                  ? l.slowRun + 1
                  : 0;
  l.transit = l.n ? (1 - alpha_) * l.transit + alpha_ * t : t;
  double bps = t > 0 ? static_cast<double>(bytes) / (t * 1e-9) : 0;
  l.bps = l.n ? (1 - alpha_) * l.bps + alpha_ * bps : bps;
  l.best = l.n ? std::min(l.best, l.transit) : l.transit;
  ++l.n;
}

void LinkMonitor::taskTime(double ns) {
  taskNs_ = taskNs_ > 0 ? 0.9 * taskNs_ + 0.1 * ns : ns;
}

bool LinkMonitor::slow(int self, std::string &why) {
  double worst = 0;
  int peer = -1;
  for (auto &[p, l] : links_) {
    double excess = l.transit - l.best;
    if (l.slow)
      l.slow = excess > 0.5 * taskNs_ &&
               l.transit > (1 + 0.5 * (ratio_ - 1)) * l.best;
    else
      l.slow = l.slowRun >= kSlowRun && l.transit > ratio_ * l.best &&
               excess > taskNs_;
    if (!l.slow)
      continue;
    if (excess > worst) {
      worst = excess;
      peer = p;
    }
  }
  if (peer < 0) {
    for (const auto &[p, isSlow] : monitorSlow_)
      if (isSlow) {
        why = "link " + std::to_string(p) + "->" + std::to_string(self) +
              " slow by the live monitor's verdict";
        return true;
      }
    return false;
  }
  const Link &l = links_.at(peer);
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "link %d->%d slow: transit %.3g ms, %.3gx its best %.3g ms", peer,
                self, l.transit * 1e-6,
                l.best > 0 ? l.transit / l.best : 0.0, l.best * 1e-6);
  why = buf;
  return true;
}

void LinkMonitor::monitorVerdict(int peer, bool slow) {
  monitorSlow_[peer] = slow;
}

std::vector<std::pair<int, double>> LinkMonitor::transitNs() const {
  std::vector<std::pair<int, double>> out;
  for (const auto &[p, l] : links_)
    out.push_back({p, l.transit});
  return out;
}

std::vector<std::pair<int, double>> LinkMonitor::bytesPerS() const {
  std::vector<std::pair<int, double>> out;
  for (const auto &[p, l] : links_)
    out.push_back({p, l.bps});
  return out;
}

//===- DiagnosisCore.cpp - what mapp-scan and the live monitor share ------===//
#include "mapp/monitor/DiagnosisCore.h"

#include <algorithm>
#include <cmath>

using namespace mapp::monitor;

double mapp::monitor::median(std::vector<double> v) {
  if (v.empty())
    return 0;
  size_t n = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + n, v.end());
  double hi = v[n];
  if (v.size() % 2)
    return hi;
  double lo = *std::max_element(v.begin(), v.begin() + n);
  return (lo + hi) / 2;
}

double mapp::monitor::percentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  size_t n = std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + n, v.end());
  return v[n];
}

double mapp::monitor::peerReference(std::vector<double> v, bool symmetric) {
  if (v.size() == 2 && !symmetric)
    return std::min(v[0], v[1]);
  return median(std::move(v));
}

double mapp::monitor::robustSpread(const std::vector<double> &v,
                                   double floor) {
  if (v.empty())
    return floor;
  double c = median(v);
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v)
    dev.push_back(std::fabs(x - c));
  return std::max(floor, 1.4826 * median(std::move(dev)));
}

double mapp::monitor::rankSlowness(double ratio, double t) {
  return std::clamp((ratio - 1) / (2 * t), 0.0, 1.0);
}

double mapp::monitor::linkSlowBar(double refNs, double t, double noiseNs,
                                  double minExcessNs) {
  return std::max({refNs / (1 - t), refNs + minExcessNs, refNs + 3 * noiseNs});
}

double mapp::monitor::linkConfidence(double refNs, double transferNs,
                                     double excessNs, double noiseNs,
                                     double t) {
  return std::clamp((1 - refNs / transferNs) / (2 * t), 0.0, 1.0) *
         std::clamp(excessNs / (6 * noiseNs), 0.0, 1.0);
}

int mapp::monitor::pipelineDirection(int srcStage, int dstStage, int stages) {
  if (dstStage == srcStage + 1)
    return 1;
  if (dstStage == srcStage - 1)
    return -1;
  if (stages > 2 && srcStage == stages - 1 && dstStage == 0)
    return 1;
  if (stages > 2 && srcStage == 0 && dstStage == stages - 1)
    return -1;
  return 0;
}

LinkClasses::Key LinkClasses::keyOf(int level, bool intra, double bytes,
                                    int dir) {
  return Key{level, intra, level < 2 ? bytes : -1.0, level == 0 ? dir : 2};
}

void LinkClasses::add(bool intraHost, double bytes, int direction) {
  size_t i = links_.size();
  links_.emplace_back(intraHost, bytes, direction);
  for (int level = 0; level < 3; ++level)
    classes_[keyOf(level, intraHost, bytes, direction)].push_back(i);
}

const std::vector<size_t> &LinkClasses::classOf(size_t i) const {
  auto [intra, bytes, dir] = links_.at(i);
  for (int level = 0;; ++level) {
    const std::vector<size_t> &c =
        classes_.at(keyOf(level, intra, bytes, dir));
    if (c.size() >= 3 || level == 2)
      return c;
  }
}

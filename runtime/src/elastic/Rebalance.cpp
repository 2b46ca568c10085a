//===- Rebalance.cpp - moving units off a slow group, by measurement -----===//
//
// Rebalancer (layers between pipeline stages) and DpBalancer (microbatches
// between data-parallel replicas) share one rule, chooseInWindow:
// docs/elastic.md, "Automatic re-partitioning" and "Uneven data-parallel
// split".
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Elastic.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>

using namespace mapp::rt;
using json = nlohmann::json;

namespace {
/// Partitions whose median predictions are within this of the best are
/// "alike" to the rebalancer (docs/elastic.md): a prediction extrapolates
/// each stage's measured per-layer cost to its new layer count, so a stage
/// measured on 2 layers and given 6 triples that measurement's noise (on
/// CI's busy cores a far partition once beat the even one by more than 3%
/// right after a fault ended).
constexpr double kAlike = 0.10;
} // namespace

Rebalancer::Rebalancer(std::vector<std::vector<int>> partitions, int current,
                       int pp, int tp, int dp, double minGain, double persist)
    : parts_(std::move(partitions)), current_(current), pp_(pp), tp_(tp),
      dp_(dp), minGain_(minGain), persist_(persist) {}

void Rebalancer::addStep(const std::vector<double> &rankSeconds,
                         const std::vector<double> &rankLayerSeconds) {
  std::vector<GroupTime> stage(pp_);
  for (size_t r = 0; r < rankSeconds.size(); ++r) {
    int s = static_cast<int>(r) / (tp_ * dp_); // Megatron order
    if (s < pp_ && rankSeconds[r] >= stage[s].total)
      stage[s] = {rankSeconds[r], r < rankLayerSeconds.size()
                                      ? rankLayerSeconds[r]
                                      : rankSeconds[r]};
  }
  stageTimes_.push_back(stage);
}

namespace {

/// A group's predicted time with m units where it measured t on `now`
/// units: its fixed part plus its per-unit cost times m.
double predictGroup(const GroupTime &t, int now, int m) {
  return t.total - t.units + t.units / std::max(now, 1) * m;
}

double predictStep(const std::vector<GroupTime> &t, const std::vector<int> &now,
                   const std::vector<int> &m) {
  double worst = 0;
  for (size_t g = 0; g < t.size(); ++g)
    worst = std::max(worst, predictGroup(t[g], now[g], m[g]));
  return worst;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct WindowChoice {
  int pick = -1;   // the candidate to switch to, -1: stay
  int target = -1; // the candidate weighed against staying, -1: none
  double gain = 1, stepNow = 0, stepNext = 0;
  int wins = 0;
};

/// The rule of Rebalancer (Elastic.h) over any candidates of moving units
/// (layers between stages, microbatches between dp replicas); `home`: the
/// candidate that needs only kHomeGain (-1: none).
WindowChoice chooseInWindow(const std::vector<std::vector<GroupTime>> &steps,
                            const std::vector<std::vector<int>> &cands,
                            int current, int home, double minGain,
                            double persist) {
  WindowChoice c;
  const size_t n = steps.size();
  if (n == 0)
    return c;
  const std::vector<int> &now = cands[current];
  // The target is the candidate with the lowest median predicted time; it
  // must then beat the current one in `persist` of the steps. (Not "the
  // single best in `persist` of the steps": candidates predicted alike,
  // e.g. 5,2,5,4 and 4,2,5,5, take turns at being best with the noise and
  // would split that vote.)
  std::vector<double> nowTimes;
  for (const auto &t : steps)
    nowTimes.push_back(predictStep(t, now, now));
  c.stepNow = median(nowTimes);
  std::vector<double> medians;
  double best = c.stepNow;
  for (const std::vector<int> &m : cands) {
    std::vector<double> times;
    for (const auto &t : steps)
      times.push_back(predictStep(t, now, m));
    medians.push_back(median(times));
    best = std::min(best, medians.back());
  }
  // Among candidates predicted alike (within kAlike of the best), the one
  // that moves the fewest units: the prediction is surest near the current
  // split; a farther one "winning" by a few % is noise.
  auto moved = [&](const std::vector<int> &m) {
    int k = 0;
    for (size_t g = 0; g < m.size(); ++g)
      k += std::abs(m[g] - now[g]);
    return k;
  };
  size_t target = current;
  int fewest = 0;
  if (medians[current] > best * (1 + kAlike))
    for (size_t i = 0; i < cands.size(); ++i) {
      const int k = moved(cands[i]);
      if (medians[i] <= best * (1 + kAlike) &&
          (target == static_cast<size_t>(current) || k < fewest ||
           (k == fewest && medians[i] < medians[target]))) {
        target = i;
        fewest = k;
      }
    }
  if (static_cast<int>(target) == current)
    return c;
  c.target = static_cast<int>(target);
  std::vector<double> gains;
  for (size_t k = 0; k < n; ++k) {
    double g = nowTimes[k] /
               std::max(predictStep(steps[k], now, cands[target]), 1e-12);
    gains.push_back(g);
    c.wins += g > 1;
  }
  c.gain = median(gains);
  c.stepNext = medians[target];
  const double bar = c.target == home ? std::min(minGain, kHomeGain) : minGain;
  if (c.wins >= persist * n && c.gain >= bar)
    c.pick = static_cast<int>(target);
  return c;
}

/// The evidence line of a window: mean group times and their fixed parts;
/// the candidate weighed against staying as `<units>_next` when the window
/// switches to it, as `<units>_weighed` when it stays (why: its gain and
/// votes against the rule's bars).
json windowEvidence(const std::vector<std::vector<GroupTime>> &steps,
                    size_t groups, const WindowChoice &c, const char *group,
                    const char *units, const std::vector<int> &now,
                    const std::vector<int> *weighed) {
  const size_t n = steps.size();
  std::vector<double> mean(groups, 0.0), fixed(groups, 0.0);
  for (const auto &t : steps)
    for (size_t g = 0; g < groups; ++g) {
      mean[g] += t[g].total * 1e3 / std::max<size_t>(n, 1);
      fixed[g] += (t[g].total - t[g].units) * 1e3 / std::max<size_t>(n, 1);
    }
  json e = {{std::string(group) + "_ms", mean},
            {std::string(group) + "_fixed_ms", fixed},
            {"steps", n},
            {std::string(units) + "_now", now}};
  if (n > 0)
    e["step_ms"] = c.stepNow * 1e3; // the median slowest group
  if (weighed) {
    e[std::string(units) + (c.pick >= 0 ? "_next" : "_weighed")] = *weighed;
    e["predicted_gain"] = c.gain;
    e["step_ms_predicted"] = c.stepNext * 1e3;
    e["votes"] = c.wins;
  }
  return e;
}

} // namespace

int Rebalancer::decide(std::string *evidence) {
  WindowChoice c =
      chooseInWindow(stageTimes_, parts_, current_, home_, minGain_, persist_);
  lastStep_ = c.stepNow;
  if (evidence)
    *evidence = windowEvidence(stageTimes_, pp_, c, "stage", "layers",
                               parts_[current_],
                               c.target >= 0 ? &parts_[c.target] : nullptr)
                    .dump();
  stageTimes_.clear();
  if (c.pick >= 0)
    current_ = c.pick;
  return c.pick;
}

DpBalancer::DpBalancer(int dp, int tp, int microbatches, double minGain,
                       double persist)
    : dp_(dp), tp_(tp), total_(dp * microbatches), minGain_(minGain),
      persist_(persist), split_(dp, microbatches) {}

void DpBalancer::setSplit(std::vector<int> split) { split_ = std::move(split); }

void DpBalancer::addStep(const std::vector<double> &rankSeconds,
                         const std::vector<double> &rankMbSeconds) {
  std::vector<GroupTime> replica(dp_);
  for (size_t r = 0; r < rankSeconds.size(); ++r) {
    int d = static_cast<int>(r) / tp_ % dp_; // Megatron order: tp, dp
    if (rankSeconds[r] >= replica[d].total)
      replica[d] = {rankSeconds[r], r < rankMbSeconds.size()
                                        ? rankMbSeconds[r]
                                        : rankSeconds[r]};
  }
  times_.push_back(replica);
}

std::vector<int> DpBalancer::bestSplit(const std::vector<GroupTime> &t,
                                       const std::vector<int> &now, int total) {
  // Greedy is exact for costs linear in the count: each next microbatch
  // goes where the replica's time after it is lowest.
  const int d = static_cast<int>(now.size());
  std::vector<int> k(d, 1);
  for (int given = d; given < total; ++given) {
    int best = 0;
    for (int g = 1; g < d; ++g)
      if (predictGroup(t[g], now[g], k[g] + 1) <
          predictGroup(t[best], now[best], k[best] + 1))
        best = g;
    ++k[best];
  }
  return k;
}

int DpBalancer::decide(std::string *evidence) {
  // Candidates: the split now, the even one, and the best split for each
  // step of the window (the window then votes among them).
  std::vector<std::vector<int>> cands = {split_,
                                         std::vector<int>(dp_, total_ / dp_)};
  for (const auto &t : times_)
    cands.push_back(bestSplit(t, split_, total_));
  std::sort(cands.begin() + 1, cands.end());
  cands.erase(std::unique(cands.begin() + 1, cands.end()), cands.end());
  cands.erase(std::remove(cands.begin() + 1, cands.end(), split_), cands.end());
  const std::vector<int> even(dp_, total_ / dp_);
  const int home = static_cast<int>(
      std::find(cands.begin() + 1, cands.end(), even) - cands.begin());
  WindowChoice c = chooseInWindow(
      times_, cands, 0, home < static_cast<int>(cands.size()) ? home : -1,
      minGain_, persist_);
  if (evidence)
    *evidence = windowEvidence(times_, dp_, c, "replica", "microbatches",
                               split_, c.target >= 0 ? &cands[c.target] : nullptr)
                    .dump();
  times_.clear();
  if (c.pick < 0)
    return 0;
  split_ = cands[c.pick];
  return 1;
}


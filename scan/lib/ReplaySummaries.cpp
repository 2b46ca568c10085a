//===- ReplaySummaries.cpp - The monitor's per-step cost on recorded jobs -===//
#include "mapp/scan/Follow.h"

#include <algorithm>
#include <chrono>

using namespace mapp::scan;
using mapp::monitor::StepSummary;

bool mapp::scan::replaySummaries(const std::vector<StepSummary> &records,
                                 const monitor::MonitorOptions &opts,
                                 ReplayStats &out, std::string *error) {
  int world = 0;
  for (const StepSummary &s : records)
    world = std::max(world, s.rank + 1);
  if (world == 0) {
    if (error)
      *error = "no summaries";
    return false;
  }
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  monitor::WindowDiagnoser d(world, opts);
  std::vector<double> stepMs;
  size_t i = 0;
  while (i < records.size()) {
    auto b = Clock::now();
    int step = records[i].step;
    for (; i < records.size() && records[i].step == step; ++i)
      d.add(records[i]);
    for (monitor::Alert &a : d.poll())
      out.alerts.push_back(std::move(a));
    stepMs.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - b).count());
    out.memoryBytes = std::max(out.memoryBytes, d.memoryBytes());
  }
  for (monitor::Alert &a : d.finish())
    out.alerts.push_back(std::move(a));
  out.totalS = std::chrono::duration<double>(Clock::now() - t0).count();
  out.exposure = monitor::exposureText(d.exposure());
  out.world = world;
  out.steps = static_cast<int>(stepMs.size());
  out.maxStepMs = *std::max_element(stepMs.begin(), stepMs.end());
  std::vector<double> sorted = stepMs;
  std::sort(sorted.begin(), sorted.end());
  out.medianStepMs = sorted[sorted.size() / 2];
  return true;
}

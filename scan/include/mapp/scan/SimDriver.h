//===- SimDriver.h - mapp-sim's modes over the simulator ------*- C++ -*-===//
//
// What mapp-sim's command line asks for, and the one function that does it
// (printing its results on stdout). See docs/mapp-sim.md.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_SIMDRIVER_H
#define MAPP_SCAN_SIMDRIVER_H

#include "mapp/scan/SimPlan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::scan {

struct SimRequest {
  // Config mode: --config job.json.
  std::string config, outDir, whatIf, summariesOut;
  bool quiet = false, haveSeed = false;
  uint64_t seed = 0;
  // Plan mode: .mplan files, the schedules to compare, the cluster.
  std::vector<std::string> plans, compare;
  PlanCluster cluster;
  bool json = false;
  // Both: --inject specs, parsed against the job's world size.
  std::vector<std::string> inject;
};

/// Plan mode when `r.plans` is not empty, else config mode (needs
/// `r.config`). false and *err (the message, without the tool's name) on a
/// problem; results printed so far stay printed.
bool runSimRequest(const SimRequest &r, std::string *err);

} // namespace mapp::scan

#endif

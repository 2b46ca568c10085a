//===- Replay.h - What-if replay of a measured trace ------------*- C++ -*-===//
//
// Turns the aligned trace into mapp-sim programs with the measured
// durations, transfer times and host gaps, and runs it twice: as measured,
// and with the findings repaired (a slow rank's compute scaled to its peers'
// median, a slow link's transfers to its peer links' bandwidth). The saving
// is the difference of the two replays, so the replay model's own error
// largely cancels.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_REPLAY_H
#define MAPP_SCAN_REPLAY_H

#include "mapp/scan/Diagnose.h"
#include "mapp/scan/Sim.h"

namespace mapp::scan {

struct WhatIfResult {
  double measuredStepMs = 0; // from the aligned trace
  double replayStepMs = 0;   // replay without changes (model fidelity)
  double repairedStepMs = 0; // replay with the findings repaired
  double savedMs = 0, savedPct = 0;
  std::vector<std::string> repaired; // what was changed
};

/// Builds the replay job; `repair` selects findings to repair.
SimJob traceToJob(const Trace &t, const Matches &m, const Diagnosis &d,
                  const std::vector<Finding> &repair);

bool whatIf(const Trace &t, const Matches &m, const Diagnosis &d,
            WhatIfResult &out, std::string *error);

} // namespace mapp::scan

#endif // MAPP_SCAN_REPLAY_H

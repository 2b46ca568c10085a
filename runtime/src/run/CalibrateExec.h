//===- CalibrateExec.h - the executor's per-instruction cost ----*- C++ -*-===//
//
// mapp-run --calibrate's op_overhead_us (docs/auto-parallel.md,
// "Calibration"): what one more instruction adds to a step run by the
// Executor, dispatch and bookkeeping included, not only its kernel call.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_RUN_CALIBRATE_EXEC_H
#define MAPP_RT_RUN_CALIBRATE_EXEC_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/Plan.h"

namespace mapp::rt {

/// The figures of measureExecutorOpOverhead: two program sizes, the best
/// step time of each, and the slope between them.
struct ExecOpOverhead {
  int opsSmall = 0, opsLarge = 0;
  double stepSmallS = 0, stepLargeS = 0;
  double perOpS = 0; // (stepLargeS - stepSmallS) / (opsLarge - opsSmall)
};

/// A one-rank plan whose one Forward block is `ops` `add`s of `elements`
/// fp32 values each, a chain (each reads the previous one's output), one
/// task: what the step costs beyond its instructions is the same for every
/// `ops`.
Plan addChainPlan(int ops, int64_t elements);

/// Runs addChainPlan(small) and addChainPlan(large) through an Executor on
/// `be` (world of one, no trace, as mapp-run runs a plan by default), the
/// two sizes alternating trial by trial until `sliceS` is spent (at least
/// 3 trials each), and takes the slope of their best step times: the
/// per-step costs (the step's bookkeeping, the backend's synchronize)
/// cancel. A slope below zero (noise on a tiny figure) is clamped to 0.
ExecOpOverhead measureExecutorOpOverhead(Backend &be, double sliceS,
                                         int opsSmall = 64,
                                         int opsLarge = 1024);

} // namespace mapp::rt

#endif

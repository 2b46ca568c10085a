//===- Launch.h - mapp-launch --elastic: supervise an mpirun job -*- C++ -*-===//
//
// mapp-launch --elastic [--elastic-plan P]... -- mpirun ... -np N ...
//   mapp-run PLAN ... --save-dir DIR ...
// runs the command, and when a rank process dies or hangs (mpirun's "process
// rank R ... exited on signal", mapp-run's "rank R did not answer") runs it
// again on the largest given layout that fits the ranks left, resumed from
// the newest intact checkpoint: ElasticJob's state machine (Elastic.h,
// docs/elastic.md), the one mapp-run --elastic uses for rank threads.
// SIGUSR1 to mapp-launch: a rank is back; the job checkpoints, stops and
// grows to the largest layout that fits again. With --repartition-plan the
// ranks measure their stages and, at a checkpoint, rank 0 reports a better
// partition on stderr (Elastic.h, ElasticReport): the job restarts on it. SIGTERM/SIGINT are passed to
// mpirun and end the job without a restart.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_LAUNCH_H
#define MAPP_RT_LAUNCH_H

#include <string>
#include <vector>

namespace mapp::rt {

struct LaunchOptions {
  std::vector<std::string> plans;   // layouts beside the command's own plan
  std::vector<std::string> repartitionPlans; // other stage partitions of it
  int maxRestarts = 8;
  std::vector<std::string> command; // mpirun ... mapp-run PLAN ...
};

/// Runs the job to its end; returns the exit status (0: every step done).
/// Error for a command it cannot supervise (no -np, no plan, no --save-dir).
int launchElastic(const LaunchOptions &o);

} // namespace mapp::rt

#endif

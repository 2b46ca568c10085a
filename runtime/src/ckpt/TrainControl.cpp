//===- TrainControl.cpp - when to save, stop signals ----------------------===//
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Error.h"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <set>

using namespace mapp::rt;

namespace {
std::atomic<bool> gStop{false};

extern "C" void onStopSignal(int) { gStop.store(true); }
} // namespace

void mapp::rt::installStopSignals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // mpirun forwards SIGUSR1 to every rank (it ends the job on SIGTERM):
  // mapp-launch --elastic asks a running job to checkpoint and stop by it.
  sigaction(SIGUSR1, &sa, nullptr);
}

bool mapp::rt::stopRequested() { return gStop.load(); }

TrainControl::TrainControl(Executor &exec, CheckpointPolicy policy,
                           CheckpointMeta meta)
    : exec_(exec), policy_(std::move(policy)), meta_(meta),
      lastSaveTime_(std::chrono::steady_clock::now()) {}

int64_t TrainControl::start() {
  const bool lead = exec_.comm().rank() == 0;
  std::set<std::string> reported;
  auto warnIncomplete = [&](const std::vector<std::string> &folders,
                            const char *flag) {
    for (const std::string &f : folders)
      if (reported.insert(f).second && lead)
        std::fprintf(stderr,
                     "mapp-run: %s: warning: '%s' has no manifest.json (a "
                     "save or prune that was interrupted, or not mapp's): not "
                     "a checkpoint, left as it is\n",
                     flag, f.c_str());
  };
  int64_t step = 0;
  if (!policy_.resume.empty()) {
    std::vector<std::string> incomplete;
    std::string ckpt = findCheckpoint(policy_.resume, &incomplete);
    warnIncomplete(incomplete, "--resume");
    std::vector<LineageLink> lineage;
    step = loadCheckpoint(exec_, ckpt, meta_, &lineage);
    meta_.ancestors = lineage; // this run continues that chain
    lastSaved_ = step;
  }
  if (!policy_.saveDir.empty()) {
    SaveDirScan scan = scanSaveDir(policy_.saveDir, meta_, step);
    warnIncomplete(scan.incomplete, "--save-dir");
    if (!scan.newer.empty()) {
      std::string list;
      for (const std::string &n : scan.newer)
        list += (list.empty() ? "" : ", ") + n;
      if (!policy_.overwrite)
        fail("--save-dir '", policy_.saveDir, "' holds checkpoints newer than "
             "this run's start (step ", step, ") that are not of its lineage: ",
             list, ". A later --resume of it would continue them, not this "
             "run; use another --save-dir, --resume from it, or "
             "--save-dir-overwrite to replace them");
      if (lead)
        std::fprintf(stderr,
                     "mapp-run: --save-dir-overwrite: %s will be removed after "
                     "this run's first save\n",
                     list.c_str());
      replace_ = scan.newerPaths;
    }
  }
  return step;
}

bool TrainControl::afterStep(bool lastStep) {
  if (policy_.saveDir.empty())
    return false;
  const int64_t done = exec_.stepsDone();
  Communicator &comm = exec_.comm();
  // A signal reaches ranks at different steps and only rank 0's clock
  // decides the interval: agree, or one rank would wait in a save alone.
  double flags[2] = {stopRequested() ? 1.0 : 0.0, 0.0};
  if (comm.rank() == 0 && policy_.intervalS > 0 &&
      std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                    lastSaveTime_)
              .count() >= policy_.intervalS)
    flags[1] = 1;
  if (exec_.plan().worldSize > 1)
    comm.allReduce(flags, 2, ReduceOp::Sum, comm.group(Group::World));
  bool stop = flags[0] > 0, timeDue = flags[1] > 0;
  bool due = lastStep || stop || timeDue ||
             (policy_.every > 0 && done % policy_.every == 0);
  if (due && done != lastSaved_) {
    saveCheckpoint(exec_, policy_.saveDir, meta_, policy_.keep, replace_);
    replace_.clear();
    lastSaved_ = done;
    lastSaveTime_ = std::chrono::steady_clock::now();
  }
  return stop;
}

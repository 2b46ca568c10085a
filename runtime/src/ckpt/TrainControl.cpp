//===- TrainControl.cpp - when to save, stop signals ----------------------===//
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Error.h"

#include <atomic>
#include <csignal>
#include <cstring>

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
}

bool mapp::rt::stopRequested() { return gStop.load(); }

TrainControl::TrainControl(Executor &exec, CheckpointPolicy policy,
                           CheckpointMeta meta)
    : exec_(exec), policy_(std::move(policy)), meta_(meta),
      lastSaveTime_(std::chrono::steady_clock::now()) {}

int64_t TrainControl::start() {
  if (policy_.resume.empty())
    return 0;
  std::string ckpt = findCheckpoint(policy_.resume);
  int64_t step = loadCheckpoint(exec_, ckpt, meta_);
  lastSaved_ = step;
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
    saveCheckpoint(exec_, policy_.saveDir, meta_, policy_.keep);
    lastSaved_ = done;
    lastSaveTime_ = std::chrono::steady_clock::now();
  }
  return stop;
}

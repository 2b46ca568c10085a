//===- Checkpoint.h - whole training state, sharded, resumable --*- C++ -*-===//
//
// A checkpoint is a folder DIR/step-NNNNNNNN/ holding one safetensors shard
// per rank (rank-RRRRR.safetensors: that rank's Params and OptStates as it
// stores them) and manifest.json (layout, every shard's tensors with their
// sharding, sizes and CRC-32s, the step, the data position and seed).
// docs/checkpoints.md is the format's reference.
//
// Everything else of the training state is a function of the step and the
// seed: the lr schedule (scheduledLr(step)), the data order (BatchLoader:
// samples step*G .. step*G+G-1), dropout masks (counter-based on the plan's
// seed and the step), AdamW's bias correction (step+1). So a checkpoint at
// step N plus the same plan and flags continues bit-identically.
//
// Writes are atomic: every file goes through a temporary file in its folder,
// fsync, rename; the step folder is built as step-N.tmp and renamed once the
// manifest is in, so a kill at any moment leaves the previous checkpoint.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CHECKPOINT_H
#define MAPP_RT_CHECKPOINT_H

#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Executor.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace mapp::rt {

/// What a checkpoint records beside the tensors, and a resume checks.
struct CheckpointMeta {
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t dataTokens = -1; // token stream length; -1 = no data
};

/// The first F32 tensor of `st` holding NaN or inf ("" if none).
std::string firstNonFiniteTensor(const Safetensors &st);

/// Collective: every rank of the world calls it after the same step. Writes
/// DIR/step-NNNNNNNN/ (N = exec.stepsDone()), then keeps the newest `keep`
/// step folders (0 = all). Returns the folder written. A non-finite value
/// in any rank's state is an Error on every rank, before anything is written.
std::string saveCheckpoint(Executor &exec, const std::string &dir,
                           const CheckpointMeta &meta, int keep);

/// The checkpoint folder `path` names: itself when it holds manifest.json,
/// else its newest step-NNNNNNNN folder. Error when there is none.
std::string findCheckpoint(const std::string &path);

/// Loads this rank's Params and OptStates from checkpoint folder `ckpt` and
/// sets the executor's step; returns that step. The same layout reads the
/// rank's own shard; another layout (tp, pp, dp) assembles full tensors from
/// every shard and cuts this rank's pieces. Every shard read is checked
/// against the manifest (size, CRC-32, tensors); any mismatch, a missing
/// shard or a model that is not the plan's is an Error naming it.
int64_t loadCheckpoint(Executor &exec, const std::string &ckpt,
                       const CheckpointMeta &expect);

/// SIGTERM / SIGINT set a flag (stopRequested) instead of killing: the run
/// finishes its step, saves and exits 0.
void installStopSignals();
bool stopRequested();

/// --save-dir / --save-every / --save-interval-s / --save-keep / --resume.
struct CheckpointPolicy {
  std::string saveDir;
  int64_t every = 0;      // steps; 0 = off
  double intervalS = 0;   // seconds; 0 = off
  int keep = 3;           // newest step folders kept; 0 = all
  std::string resume;     // DIR (a checkpoint or a save dir)
};

/// One rank's checkpoint schedule over a run.
class TrainControl {
public:
  TrainControl(Executor &exec, CheckpointPolicy policy, CheckpointMeta meta);
  /// --resume: loads the checkpoint; returns the first step to run (0
  /// without --resume).
  int64_t start();
  /// After each step. Ranks agree (one small world all-reduce, only with
  /// --save-dir) on whether a stop signal came or the save interval passed,
  /// save when due (every N steps, the interval, the last step, a signal),
  /// and return true when the run must stop now (a signal).
  bool afterStep(bool lastStep);

private:
  Executor &exec_;
  CheckpointPolicy policy_;
  CheckpointMeta meta_;
  int64_t lastSaved_ = -1;
  std::chrono::steady_clock::time_point lastSaveTime_;
};

} // namespace mapp::rt

#endif

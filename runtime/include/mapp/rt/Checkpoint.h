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
// fsync, rename; the step folder is built as step-N.RUNID.tmp and renamed
// once the manifest is in, so a kill at any moment leaves the previous
// checkpoint.
//
// The save directory owns only what a run wrote: temporaries carry the run
// id and an owner file (cleaned when they are this run's or provably
// abandoned by a job of the same plan); retention prunes only this run's
// lineage (its own checkpoints and the resume chain it continues, recorded
// in the manifest); the manifest is sealed (CRC-32 over every field) and
// every field is validated, each shard's own step/rank/layout metadata
// compared against it.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CHECKPOINT_H
#define MAPP_RT_CHECKPOINT_H

#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Executor.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt {

/// A run of a checkpoint's resume chain and the step its successor resumed
/// from: that run's checkpoints up to `step` are this run's history.
struct LineageLink {
  std::string runId;
  int64_t step = 0;
};

/// What a checkpoint records beside the tensors, and a resume checks; who
/// writes it (the save directory's ownership rules).
struct CheckpointMeta {
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t dataTokens = -1; // token stream length; -1 = no data
  std::string runId;        // this job's (every rank the same)
  uint32_t planChecksum = 0; // the plan seal's checksum
  std::vector<LineageLink> ancestors; // set by a resume, oldest first
  int64_t runSteps = -1;    // --steps; a checkpoint past it is refused
  std::chrono::system_clock::time_point started =
      std::chrono::system_clock::now();
};

/// Whether the checkpoint of run `runId` at `step` belongs to this run's
/// lineage: written by it, or by an ancestor at or before the step the
/// chain left that ancestor.
bool inLineage(const CheckpointMeta &meta, const std::string &runId,
               int64_t step);

/// The CRC-32 seal of a manifest's JSON text (8 hex digits): over the
/// compact, key-sorted text of every field but "seal" (docs/checkpoints.md).
/// Throws Error when the text is not a JSON object.
std::string manifestSeal(const std::string &manifestText);

/// The first F32 tensor of `st` holding NaN or inf ("" if none).
std::string firstNonFiniteTensor(const Safetensors &st);

/// Collective: every rank of the world calls it after the same step. Writes
/// DIR/step-NNNNNNNN/ (N = exec.stepsDone()), then removes `replace` (step
/// folders of other runs the user allowed to overwrite) and keeps the newest
/// `keep` step folders of this run's lineage (0 = all); other runs' folders
/// and anything else in DIR are never touched. Returns the folder written. A
/// non-finite value in any rank's state is an Error on every rank, before
/// anything is written.
std::string saveCheckpoint(Executor &exec, const std::string &dir,
                           const CheckpointMeta &meta, int keep,
                           const std::vector<std::string> &replace = {});

/// The checkpoint folder `path` names: itself when it holds manifest.json,
/// else its newest step-NNNNNNNN folder with a manifest. Error when there is
/// none. `incomplete` (optional) receives the step-NNNNNNNN folders without
/// a manifest (an interrupted save or prune of an older mapp), newest first.
std::string findCheckpoint(const std::string &path,
                           std::vector<std::string> *incomplete = nullptr);

/// What a save directory holds that this run must not shadow or touch.
struct SaveDirScan {
  /// Step folders newer than this run's start that are not of its lineage
  /// (another run's, unreadable or without a manifest): a later --resume
  /// of DIR would continue them, not this run. "step-00000010 (run ID)".
  std::vector<std::string> newer, newerPaths;
  /// Step folders without a manifest, any step.
  std::vector<std::string> incomplete;
};
/// Reads DIR's step folders (DIR may not exist yet) for a run starting at
/// `startStep`.
SaveDirScan scanSaveDir(const std::string &dir, const CheckpointMeta &meta,
                        int64_t startStep);

/// Loads this rank's Params and OptStates from checkpoint folder `ckpt` and
/// sets the executor's step; returns that step. The same layout reads the
/// rank's own shard; another layout (tp, pp, dp) assembles full tensors from
/// every shard and cuts this rank's pieces. Every shard read is checked
/// against the manifest (size, CRC-32, tensors); any mismatch, a missing
/// shard or a model that is not the plan's is an Error naming it, as is a
/// manifest whose seal does not match or any field out of range. `lineage`
/// (optional) receives the checkpoint's resume chain ending with its own run.
int64_t loadCheckpoint(Executor &exec, const std::string &ckpt,
                       const CheckpointMeta &expect,
                       std::vector<LineageLink> *lineage = nullptr);

/// SIGTERM / SIGINT / SIGUSR1 set a flag (stopRequested) instead of killing:
/// the run finishes its step, saves and exits 0.
void installStopSignals();
bool stopRequested();

/// --save-dir / --save-every / --save-interval-s / --save-keep / --resume.
struct CheckpointPolicy {
  std::string saveDir;
  int64_t every = 0;      // steps; 0 = off
  double intervalS = 0;   // seconds; 0 = off
  int keep = 3;           // newest step folders of this lineage kept; 0 = all
  std::string resume;     // DIR (a checkpoint or a save dir)
  bool overwrite = false; // --save-dir-overwrite: replace other runs' newer
                          // checkpoints instead of refusing to start
};

/// One rank's checkpoint schedule over a run.
class TrainControl {
public:
  TrainControl(Executor &exec, CheckpointPolicy policy, CheckpointMeta meta);
  /// --resume: loads the checkpoint (this run continues its lineage);
  /// --save-dir: refuses a save dir holding another run's newer checkpoints
  /// unless --save-dir-overwrite. Warns of step folders without a manifest.
  /// Returns the first step to run (0 without --resume).
  int64_t start();
  /// After each step. Ranks agree (one small world all-reduce, only with
  /// --save-dir) on whether a stop signal came or the save interval passed,
  /// save when due (every N steps, the interval, the last step, a signal),
  /// and return true when the run must stop now (a signal).
  bool afterStep(bool lastStep);
  /// Steps done at the newest checkpoint this run wrote or resumed (-1: none).
  int64_t lastSaved() const { return lastSaved_; }

private:
  Executor &exec_;
  CheckpointPolicy policy_;
  CheckpointMeta meta_;
  int64_t lastSaved_ = -1;
  std::chrono::steady_clock::time_point lastSaveTime_;
  std::vector<std::string> replace_; // --save-dir-overwrite, at the first save
};

} // namespace mapp::rt

#endif

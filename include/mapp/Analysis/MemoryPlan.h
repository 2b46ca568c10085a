//===- MemoryPlan.h - liveness and buffer assignment ------------*- C++ -*-===//
//
// Places every activation of one pipeline stage in a per-microbatch arena,
// reusing bytes between values whose live ranges do not overlap, and lays out
// the persistent pool (parameters, gradients, optimizer state).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_ANALYSIS_MEMORYPLAN_H
#define MAPP_ANALYSIS_MEMORYPLAN_H

#include "mapp/Analysis/StepStructure.h"
#include "mapp/Dialect/Mapp/IR/MappOps.h"
#include "llvm/ADT/MapVector.h"

namespace mapp {

/// Offsets are multiples of this (GPU-friendly).
constexpr uint64_t kPlanAlignment = 256;

struct ParamStorage {
  mlir::StringAttr name;
  mlir::RankedTensorType type;
  unsigned numStates = 0; // AdamW 2, SGD 1, none 0
  uint64_t paramOffset = 0, gradOffset = 0;
  llvm::SmallVector<uint64_t, 2> stateOffsets;
};

struct StageMemory {
  int64_t stage = 0;
  /// Arena offset of every activation (canonical values: a backward's
  /// arguments are their forward's results).
  llvm::DenseMap<mlir::Value, uint64_t> offsets;
  /// Parameters this stage owns, in declaration order.
  llvm::MapVector<mlir::StringAttr, ParamStorage> params;
  /// Reshapes whose result is a view of their operand: the result's offset
  /// is the operand's and the instruction copies nothing (`alias` in the
  /// plan). Maps the result to the arena value whose storage it shares.
  llvm::DenseMap<mlir::Value, mlir::Value> aliasOf;
  /// Reshapes that keep their own storage (and copy).
  int64_t copiedReshapes = 0;
  /// Arena values stored as bf16 (2 bytes an element) under
  /// `mapp.activation_storage = "bf16"`; alias results are listed too.
  llvm::DenseSet<mlir::Value> bf16;
  uint64_t arenaBytes = 0;      // one microbatch slot
  uint64_t naiveArenaBytes = 0; // without reuse, for the report
  uint64_t persistentBytes = 0;
  int64_t slots = 1;
  /// Activations one (chunk, microbatch) keeps from its forward to its
  /// backward: the forward's saved results (their storage, aliases counted
  /// once), the largest over the stage's chunks (plan.fbs stash_bytes).
  uint64_t stashBytes = 0;
  /// Per mapp.schedule op (in module order): its kind and the most
  /// (chunk, microbatch) activations this stage holds at once under it.
  std::vector<std::pair<std::string, int64_t>> stashPeaks;
  uint64_t peakBytes() const { return persistentBytes + slots * arenaBytes; }
};

/// Plans one stage; fails with a located error on IR it cannot place
/// (dynamic shapes, unknown parameters, an unknown activation storage).
/// `aliasReshapes = false` gives every reshape its own storage (a copy), for
/// measuring what aliasing saves. The module's `mapp.activation_storage`
/// ("f32", the default, or "bf16") sizes activations: under "bf16", every
/// f32 arena value of rank >= 2 takes 2 bytes an element, except operands of
/// grad_accumulate (parameter-gradient contributions stay fp32 like the Grad
/// buffers they feed) and alias chains with such a member or a member of
/// rank < 2 (one buffer, one storage type).
mlir::FailureOr<StageMemory> planStageMemory(mlir::ModuleOp module,
                                             const StepStructure &step,
                                             int64_t stage,
                                             bool aliasReshapes = true);

/// Microbatches whose activations are alive at once on `stage`, from the
/// module's mapp.schedule tables (only the one of `kind` when given; 1
/// without one).
int64_t inFlightMicrobatches(mlir::ModuleOp module, int64_t stage,
                             llvm::StringRef kind = {});

/// The most (chunk, microbatch) activations `stage` holds at once under the
/// table of `sched`: from a forward to its backward (B, or W when split).
int64_t peakStashed(ScheduleOp sched, int64_t stage);

/// schedule=adaptive with a memory cap: the arena slots of `mem` shrink to
/// what the cap holds (persistent pool + slots x arena <= cap), since the
/// runtime's scheduler admits a microbatch only into a free slot; a located
/// error when the cap cannot hold the slots the dfc table needs (the order
/// `--schedule static` runs, and the scheduler's fallback).
mlir::LogicalResult applyMemCap(mlir::ModuleOp module,
                                const ParallelLayout &layout,
                                StageMemory &mem);

/// The module attribute that selects activation storage, and its values.
constexpr llvm::StringLiteral kActivationStorageAttr = "mapp.activation_storage";
/// Whether `mapp.activation_storage` asks for bf16 activations; a located
/// error for a value other than "f32" or "bf16".
mlir::FailureOr<bool> bf16Activations(mlir::ModuleOp module);

/// Whether the value lives in the persistent pool rather than the arena.
bool isPersistentAlias(mlir::Value v);

} // namespace mapp

#endif

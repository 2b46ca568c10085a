//===- StepStructure.h - the blocks of a training step ----------*- C++ -*-===//
//
// Reads the function conventions of docs/plan-lowering.md: which functions
// are plan blocks, on which pipeline stage and chunk they run, and how a
// forward's saved results feed its backward's arguments.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_ANALYSIS_STEPSTRUCTURE_H
#define MAPP_ANALYSIS_STEPSTRUCTURE_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include <optional>

namespace mapp {

enum class Phase { Forward, Backward, BackwardInput, BackwardWeight, Optimizer };

struct StepBlock {
  /// Op handles are cheap value types; const blocks still reach mutable IR.
  mutable mlir::func::FuncOp func;
  Phase phase;
  int64_t stage = 0;
  int64_t chunk = 0;
  /// Forward only: result 0 is the microbatch loss.
  bool hasLoss = false;
  /// An optimizer without `mapp.stage` serves every stage, each updating the
  /// parameters it owns.
  bool everyStage = false;
};

/// Parallel layout from the module's `mapp.parallel` dictionary (defaults 1).
/// The module attribute of schedule=adaptive (--mapp-pipeline-schedule):
/// {mem_cap_bytes, slow_link_ratio, bandwidth_smoothing}, plan.fbs
/// AdaptivePolicy.
inline constexpr llvm::StringLiteral kAdaptiveAttr = "mapp.adaptive";

struct AdaptiveLayout {
  uint64_t memCapBytes = 0; // 0: the backend's free memory
  double slowLinkRatio = 1.5;
  double bandwidthSmoothing = 0.25;
};

struct ParallelLayout {
  int64_t tp = 1, pp = 1, dp = 1, chunks = 1, microbatches = 1;
  /// Expert-parallel degree (mapp.parallel "ep", --mapp-expert-parallel);
  /// 0 when absent (the runtime's "ep" group is then the dp group).
  int64_t ep = 0;
  /// Context-parallel degree (mapp.parallel "cp", --mapp-context-parallel):
  /// cp consecutive dp ranks share a batch; 0 when absent.
  int64_t cp = 0;
  std::string schedule = "sequential";
  /// Set iff schedule == "adaptive" (from mapp.adaptive).
  std::optional<AdaptiveLayout> adaptive;
  int64_t worldSize() const { return tp * pp * dp; }
};

struct StepStructure {
  ParallelLayout layout;
  /// Blocks in plan order: forwards by (stage, chunk), then backwards, then
  /// the optimizer.
  llvm::SmallVector<StepBlock> blocks;

  /// Collects the blocks of `module`; emits a located error and fails on a
  /// malformed step (bad attributes, a forward without its backward, saved
  /// results that do not match the backward's arguments).
  static mlir::FailureOr<StepStructure> analyze(mlir::ModuleOp module);

  /// The blocks of one pipeline stage, in plan order.
  llvm::SmallVector<const StepBlock *> blocksOfStage(int64_t stage) const;
  /// The block whose results feed `consumer`'s arguments: the forward of a
  /// backward (or backward-input), the backward-input of a backward-weight.
  const StepBlock *producerOf(const StepBlock &consumer) const;
  /// Maps a consumer's block argument to the producer value it stands for;
  /// any other value maps to itself.
  mlir::Value canonical(mlir::Value v) const;
};


} // namespace mapp

#endif

//===- TestPlans.h - hand-built plans for tests -----------------*- C++ -*-===//
//
// Writes plan artifacts with the FlatBuffers builder, the way the compiler's
// Target/Plan writer will, so runtime tests do not wait for the compiler.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_TEST_PLANS_H
#define MAPP_RT_TEST_PLANS_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Plan.h"

#include <string>
#include <vector>

namespace mapp::rt::test {

struct TValue {
  std::string name;
  ValueKind kind;
  DType dtype;
  Shape shape;
  int param = -1;
  // Overrides for loader tests; by default build() computes them.
  int64_t offset = -1, bytes = -1;
  int shardDim = -1; // Param sharding (plan.fbs)
  std::string shardGroup;
  int shardBlocks = 1;
  bool storageBf16 = false; // plan.fbs storage_bf16 (bytes: numel * 2)
};
struct TInstr {
  std::string kernel;
  std::vector<int> in, out;
  Attrs attrs;
};
struct TBlock {
  BlockKind kind;
  std::vector<TInstr> instrs;
  int chunk = 0;
};

/// A single-program plan; offsets are assigned by build() (arena for
/// Temp/Input/Loss, pool for the rest, 64-byte aligned, no reuse).
struct PlanSpec {
  int microBatchSize = 2, seqLength = 8, vocabSize = 16, numMicrobatches = 1;
  std::string optimizer = "sgd";
  double maxGradNorm = 0;
  int slots = 1;
  std::vector<TValue> values;
  std::vector<TBlock> blocks;
  std::vector<std::pair<int, int>> tasks; // (block, microbatch)
  /// MegaDPP (plan.fbs ScheduleTable): (name, tasks) and the stash size.
  std::vector<std::pair<std::string, std::vector<std::pair<int, int>>>>
      scheduleTables;
  uint64_t stashBytes = 0; ///< 0: arena bytes / chunksHint
  int chunksHint = 1;
  int tokens = -1, targets = -1, loss = -1;
  uint32_t version = kPlanSchemaVersion;
  int rank = 0, tp = 0, dp = 0, pp = 0; // this program's coordinates
  Placement placement; ///< MegaFBD (plan.fbs Placement); written when set

  int add(TValue v) {
    values.push_back(std::move(v));
    return static_cast<int>(values.size()) - 1;
  }
  std::vector<uint8_t> build() const;
};

/// The plan-wide fields of a multi-rank plan; programs[r] is rank r's.
struct MultiPlanSpec {
  int tp = 1, pp = 1, dp = 1, chunks = 1;
  int traceEvery = 0, traceWindow = 1;
  std::string schedule = "1f1b";
  /// Written as Plan.adaptive when schedule == "adaptive".
  AdaptivePolicy adaptive;
  std::vector<PlanSpec> programs;
  int worldSize = 0; ///< 0: programs.size()
  std::vector<uint8_t> build() const;
};

struct MlpOptions {
  int vocab = 16, hidden = 8, ffn = 12, batch = 2, seq = 8, microbatches = 1;
  std::string optimizer = "sgd"; // sgd | adamw
  double lr = 0.1;
  double maxGradNorm = 0;
  std::string schedule = "constant";
  /// Loss scaling as --mapp-mixed-precision lowers it (docs/checkpoints.md,
  /// "Loss scaling"): "" = none, "dynamic" or "static" on the dloss fill and
  /// the optimizer instrs, with these attrs on the optimizer instrs.
  std::string lossScale;
  double lossScaleInit = 65536, lossScaleGrowth = 2, lossScaleBackoff = 0.5,
         lossScaleLimit = 0; // 0 = the fp32 range
  int64_t lossScaleGrowthInterval = 1000;
};

/// Sets the loss-scale attrs of an optimizer instr (o.lossScale non-empty).
void setLossScaleAttrs(const MlpOptions &o, Attrs &at);

/// embedding -> linear+gelu -> linear -> cross_entropy, its hand-written
/// backward (cross_entropy_grad, matmul, reduce_sum, gelu_grad,
/// embedding_grad, grad_accumulate) and one optimizer instr per parameter.
/// Params: wte.weight [V,H], fc.weight [F,H], fc.bias [F], head.weight [V,F],
/// head.bias [V]. Gradients are scaled by 1/microbatches via dloss.
PlanSpec mlpPlan(const MlpOptions &o);

/// The same MLP split over tp x pp x dp ranks (Megatron order) with `chunks`
/// virtual stages per pipeline rank. Pieces: p0 embedding | p1 fc+gelu |
/// p2 head | p3 cross-entropy, cut into pp*chunks virtual stages (1: all,
/// 2: p0p1|p2p3, 4: one each); virtual stage v runs on pipeline rank v % pp
/// as chunk v / pp, with send/recv (tag 2k forward, 2k+1 backward at cut k)
/// between them. tp: fc column-parallel (fc.weight, fc.bias shard_dim 0),
/// head row-parallel (head.weight shard_dim 1) with all_reduce(tp) of the
/// partial logits and of the input gradient. dp: each rank runs
/// o.microbatches microbatches, then an all_reduce(avg, dp) of every Grad
/// (a Backward block run once after the last backward). Schedules: pp=1 fwd/bwd
/// per microbatch; pp>1, chunks=1: 1F1B; chunks>1: all forwards by (chunk,
/// mb), then all backwards by (reverse chunk, mb). traceInstrs wraps every
/// instr in trace_begin/trace_end.
struct ParallelOptions {
  int tp = 1, pp = 1, dp = 1, chunks = 1;
  bool traceInstrs = false;
  int traceEvery = 0, traceWindow = 1;
  /// MegaDPP: "" (the tables above), "dfc" or "bfc" (static, that order),
  /// "adaptive" (table = dfc, schedule_tables {dfc, bfc}, Plan.adaptive).
  /// dfc is Megatron's interleaved order with group N = pp (1F1B for one
  /// chunk); bfc is the looped breadth-first order (all forwards by (chunk,
  /// mb), then all backwards by (chunk descending, mb)). Needs
  /// microbatches % pp == 0 when chunks > 1.
  std::string dpp;
  AdaptivePolicy adaptive;
  uint64_t stashBytes = 0; ///< 0: the arena's bytes / chunks
};
MultiPlanSpec parallelMlpPlan(const MlpOptions &o, const ParallelOptions &p);

/// Megatron's interleaved order of (chunk, microbatch, isBackward) for
/// pipeline rank r of p with v chunks, m microbatches and group n
/// (p <= n <= m, m % n == 0): warm-up 2(p-r-1) + (v-1)n forwards, then
/// one forward one backward, then the remaining backwards.
struct ChunkTask {
  int chunk, mb;
  bool backward;
};
std::vector<ChunkTask> interleavedOrder(int p, int r, int v, int m, int n);

} // namespace mapp::rt::test

#endif

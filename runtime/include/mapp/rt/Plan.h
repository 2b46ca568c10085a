//===- Plan.h - the loaded, verified plan -----------------------*- C++ -*-===//
//
// The loader turns the FlatBuffers artifact (schema/plan.fbs) into these plain
// structs after verifying every index, offset and kernel signature, so the
// executor never has to re-check anything on the hot path.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PLAN_H
#define MAPP_RT_PLAN_H

#include "mapp/rt/Attrs.h"
#include "mapp/rt/Tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mapp::rt {

/// The plan schema version this runtime reads: SchemaVersion.Current of
/// schema/plan.fbs (defined there once; PlanSeal.cpp exports it).
extern const uint32_t kPlanSchemaVersion;

enum class ValueKind : uint8_t {
  Temp = 0,
  Param = 1,
  Grad = 2,
  OptState = 3,
  Input = 4,
  Loss = 5
};
const char *valueKindName(ValueKind k);
/// Temp, Input and Loss live in the per-slot arena; the rest in the pool.
inline bool inArena(ValueKind k) {
  return k == ValueKind::Temp || k == ValueKind::Input || k == ValueKind::Loss;
}

enum class BlockKind : uint8_t {
  Forward = 0,
  Backward = 1,
  BackwardInput = 2,
  BackwardWeight = 3,
  Optimizer = 4
};
const char *blockKindName(BlockKind k);

struct Value {
  std::string name;
  ValueKind kind = ValueKind::Temp;
  TensorType type;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  int param = -1;
  /// Param sharding (plan.fbs): -1 = the whole tensor on every holder.
  int shardDim = -1;
  std::string shardGroup;
  int shardBlocks = 1;
  /// Stored as bf16 in `bytes` = numel · 2 (plan.fbs storage_bf16).
  bool storedBf16 = false;
};

struct Instr {
  std::string kernel;
  std::vector<int> inputs;
  std::vector<int> outputs;
  Attrs attrs;
  std::string name;
  int layer = -1;
};

struct Block {
  BlockKind kind = BlockKind::Forward;
  int chunk = 0;
  std::vector<Instr> instrs;
};

struct Task {
  int block = 0;
  int microbatch = 0;
};

/// MegaDPP: one alternative order of a program's tasks (plan.fbs).
struct ScheduleTable {
  std::string name; ///< "dfc" | "bfc"
  std::vector<Task> tasks;
};

/// MegaFBD: where a program runs (plan.fbs Placement). Empty backend: the
/// job's --backend.
struct Placement {
  std::string backend; ///< "" | "cpu" | "cuda"
  int device = -1;     ///< -1: the rank's default device
  std::string role;    ///< "" | "fwd" | "bwd"
  int peerRank = -1;   ///< the rank holding the other half of the stage
  int tp = 0;          ///< tp degree of this program's side (0: Plan.tp)
};

/// MegaDPP's run-time switch (plan.fbs AdaptivePolicy).
struct AdaptivePolicy {
  uint64_t memCapBytes = 0; ///< 0: the backend's free memory
  double slowLinkRatio = 1.5;
  double bandwidthSmoothing = 0.25;
};

struct Program {
  int rank = 0;
  int dp = 0, pp = 0, tp = 0;
  std::vector<Value> values;
  std::vector<Block> blocks;
  std::vector<Task> tasks;
  uint64_t arenaBytes = 0;
  uint64_t persistentBytes = 0;
  int slots = 1;
  int tokens = -1, targets = -1, loss = -1;
  uint64_t peakBytes = 0;
  std::vector<ScheduleTable> scheduleTables; ///< adaptive plans only
  uint64_t stashBytes = 0; ///< activations one (chunk, mb) keeps to its B
  Placement placement;
};

struct Plan {
  uint32_t version = 0;
  int worldSize = 1;
  int tp = 1, pp = 1, dp = 1, chunks = 1;
  /// Expert-parallel degree (divides dp); 0 in plans before the ep pass.
  int ep = 0;
  /// Context-parallel degree (divides dp, docs/context-parallel.md); 0 in
  /// plans without context parallelism.
  int cp = 0;
  int microBatchSize = 0;
  int numMicrobatches = 1;
  int seqLength = 0;
  int vocabSize = 0;
  std::string schedule;
  std::string optimizer;
  double maxGradNorm = 0;
  /// MegaScan sampling: trace_window steps out of every trace_every (0: all).
  int traceEvery = 0, traceWindow = 1;
  AdaptivePolicy adaptive; ///< meaningful iff schedule == "adaptive"
  std::vector<Program> programs;
  /// The file's seal checksum (CRC-32 of body and seal header): identifies
  /// the plan in trace headers (docs/trace-format.md, "Run identity").
  uint32_t checksum = 0;
};

/// Size of the PlanSeal trailer after the FlatBuffers body (plan.fbs).
constexpr size_t kPlanSealBytes = 24;
/// CRC-32 (zlib's) of `size` bytes, continuing `crc` (0 to start): the
/// plan seal's checksum, also used for checkpoint shards and the manifest
/// seal (Checkpoint.cpp).
uint32_t sealCrc32(const uint8_t *data, size_t size, uint32_t crc = 0);
/// Appends the seal to a FlatBuffers Plan body: the bytes of a .mplan file.
std::vector<uint8_t> sealPlan(const uint8_t *body, size_t size);
/// Checks the seal of a .mplan file held in memory and returns the body's
/// size (the body starts at `data`); `checksum` receives the seal's checksum.
/// Throws Error("plan: corrupt plan: ...") on any mismatch.
size_t checkPlanSeal(const uint8_t *data, size_t size, uint32_t &checksum);

/// Parses and verifies a sealed plan held in memory (8-byte aligned).
/// Throws Error("plan: ...").
Plan parsePlan(const uint8_t *data, size_t size);
/// Reads `path` and parses it. Throws Error naming the file on I/O failure.
Plan loadPlan(const std::string &path);
/// Semantic checks of an already decoded plan (run by parsePlan too).
void verifyPlan(const Plan &plan);

/// The expert-parallel degree: ep, or dp for plans without one (their "ep"
/// group is the whole dp group).
inline int expertDegree(const Plan &plan) {
  return plan.ep > 0 ? plan.ep : plan.dp;
}
/// A sharded Param's shard group size ("tp": the program's tp side, "ep":
/// the expert degree, "dp": dp) and program q's index in that group; 1 and
/// 0 for a value that is not sharded.
inline int shardGroupSize(const Plan &plan, const Program &q,
                          const Value &owner) {
  if (owner.shardDim < 0)
    return 1;
  if (owner.shardGroup == "tp")
    return q.placement.tp > 0 ? q.placement.tp : plan.tp;
  if (owner.shardGroup == "ep")
    return expertDegree(plan);
  return plan.dp;
}
inline int shardGroupIndex(const Plan &plan, const Program &q,
                           const Value &owner) {
  if (owner.shardDim < 0)
    return 0;
  if (owner.shardGroup == "tp")
    return q.tp;
  if (owner.shardGroup == "ep")
    return q.dp % expertDegree(plan);
  return q.dp;
}

/// MegaFBD: whether some program has a Placement role ("fwd" | "bwd").
bool isFbdPlan(const Plan &plan);

/// Per block, per instr: the layer whose work the instr is (-1: none, e.g.
/// the embedding, the head, the loss): the instr's own `layer`, else
/// followed through the dataflow from the `layers.N.*` values it reads
/// (runtime/src/plan/WorkLayers.cpp). Re-partitioning's per-layer cost.
std::vector<std::vector<int>> workLayers(const Program &p);
/// N of a value named `layers.N.…` (a layer's parameter, its gradient or
/// optimizer state); -1 for any other name.
int layerOfName(const std::string &name);
/// MegaFBD: tag of the step-end parameter messages from the backward to
/// the forward ranks (away from pipeline and gather tags); mapp-sim
/// replays them under the same tag.
constexpr int64_t kFbdParamTag = int64_t(1) << 28;

/// Whether some value of `p` is planned as bf16 storage (storage_bf16).
bool hasBf16Storage(const Program &p);
/// `p` for a backend that stores every value as its dtype: each arena value's
/// offset and the arena's size doubled (a bf16 value's 2 bytes an element
/// become 4; intervals that were disjoint stay disjoint), storage_bf16
/// cleared. The pool is unchanged.
Program withF32Storage(const Program &p);

} // namespace mapp::rt

#endif

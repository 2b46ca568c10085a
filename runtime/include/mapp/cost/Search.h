//===- Search.h - the auto-parallel search over layouts ---------*- C++ -*-===//
//
// Prices a training step of a GPT (dense or MoE) under a layout (tp, pp,
// dp, ep, chunks, micro-batch size and count, schedule, recomputation,
// ZeRO-1, compute precision, activation storage) with the cost primitives
// of CostModel.h, and searches every layout of a world size and global
// batch under a memory cap: exhaustive, with pruning (docs/auto-parallel.md
// says why exhaustive suffices up to 4,096 devices). `--mapp-auto-parallel`
// (the compiler) and `mapp-sim --auto-parallel` call it.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_COST_SEARCH_H
#define MAPP_COST_SEARCH_H

#include "mapp/cost/CostModel.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mapp::cost {

/// The model's dimensions (a GPT config's keys).
struct ModelDims {
  std::string name;
  bool llama = false; // RMSNorm, SwiGLU, rotary, no biases
  int64_t layers = 0, hidden = 0, heads = 0, kvHeads = 0, ffn = 0;
  int64_t vocab = 0, seq = 0;
  bool tiedEmbeddings = true;
  int64_t experts = 0, topk = 2, moeFfn = 0; // MoE (every layer)
  /// Instructions of one layer's forward (its backward ~2x): the plan's
  /// dispatch count, from the IR when the compiler searches (20 if unknown).
  double layerForwardOps = 20;

  int64_t headDim() const { return heads ? hidden / heads : 0; }
  /// Parameters of one transformer layer and of the embeddings/head.
  double layerParams() const;
  double denseLayerParams() const; // without the experts
  double embeddingParams() const;
  double totalParams() const;
  /// Training FLOPs of one sequence (forward + backward, no recomputation):
  /// the numerator of MFU.
  double trainFlopsPerSequence() const;
};

/// Reads a GPT config (docs/models.md keys: num_layers, hidden_size, ...);
/// a located error naming the key.
bool parseModelDims(const std::string &text, const std::string &name,
                    ModelDims &out, std::string *error);

enum class Recompute { None, Selective, Full };
const char *recomputeName(Recompute r);

struct Layout {
  int tp = 1, pp = 1, dp = 1, ep = 1, chunks = 1;
  int microBatch = 1, microbatches = 1;
  std::string schedule = "1f1b"; // 1f1b interleaved zb-h1 dfc bfc adaptive gpipe
  Recompute recompute = Recompute::None;
  bool zero1 = false;
  DType compute = DType::F32;
  DType storage = DType::F32; // activation storage (f32, bf16)

  /// "tp=2 pp=2 dp=2 ..." in --mapp-train-pipeline's option syntax, plus
  /// the storage/precision options the compiler takes beside it.
  std::string pipelineOptions() const;
  std::string brief() const; // a short key for tables
};

struct Prediction {
  double stepMs = 0;
  double tokensPerS = 0;
  double peakBytes = 0;     // per device, the worst stage
  double bubbleFraction = 0;
  double exposedCommMs = 0; // per step, on the critical stage
  double computeMs = 0;     // the critical stage's compute per step
  double mfu = 0;           // model FLOPs / (peak x devices x step)
  // Memory terms of the worst stage (bytes).
  double paramStateBytes = 0, activationBytes = 0, workspaceBytes = 0;
  /// What the backend holds beside the plan's blocks: the bf16 shadows of
  /// the weights, the logits' bf16 copy, the profile's runtime reserve.
  /// The compiler adds it to the memory planner's peak (docs/auto-parallel.md).
  double outsidePlanBytes = 0;
};

/// Where the search may look.
struct SearchSpace {
  std::vector<std::string> schedules{"1f1b", "interleaved", "zb-h1", "dfc",
                                     "bfc", "adaptive", "gpipe"};
  std::vector<Recompute> recomputes{Recompute::None, Recompute::Selective,
                                    Recompute::Full};
  std::vector<int> chunks{1, 2, 4};
  std::vector<int> microBatches; // empty: divisors of the global batch <= 16
  bool zero1 = true;
  bool tpInsideNode = true;      // tp never spans nodes
  int maxTp = 0, maxPp = 0;      // 0: no bound
  std::vector<DType> computes;   // empty: the widest the device has
  std::vector<DType> storages;   // empty: f32, and bf16 where stored so
  bool allowUnevenStages = true; // layers % (pp x chunks) != 0
};

struct SearchRequest {
  ModelDims model;
  Cluster cluster;
  Profile profile; // effectiveProfile(...)
  int world = 0;
  int globalBatch = 0; // sequences per step
  double memCapBytes = 0; // 0: the device's memory
  /// Layouts predicted over the cap by at most this fraction stay ranked
  /// (flagged): for the compiler, whose memory planner checks each one
  /// before it is chosen. The formula's activation terms are upper bounds
  /// (10% high at micro-batch 4 on the 1.3B GPT); 0 where nothing checks.
  double capSlack = 0;
  int top = 5;
  SearchSpace space;
};

struct Ranked {
  Layout layout;
  Prediction pred;
  bool overCapPredicted = false; // kept by capSlack: the planner decides
};

struct SearchResult {
  std::vector<Ranked> top;   // best first
  size_t feasible = 0;       // layouts that fit (as predicted)
  size_t considered = 0;     // layouts priced
  size_t overCap = 0;        // priced but over the cap (and its slack)
  /// Layouts pruned before pricing, by reason ("tp does not divide the
  /// heads" -> count).
  std::vector<std::pair<std::string, size_t>> rejected;
  Ranked smallest;           // least memory of all priced (over cap too)
  double searchSeconds = 0;
};

/// Prices one layout; false (with why) when the layout is not valid for the
/// model and world (a divisibility, the schedule's rules).
bool validLayout(const ModelDims &m, const Layout &l, int world,
                 int globalBatch, const Cluster &c, bool tpInsideNode,
                 std::string *why);
Prediction predict(const ModelDims &m, const Layout &l, const Cluster &c,
                   const Profile &p);

/// The search. False with an error when nothing fits (naming the smallest
/// memory found and the knob that would lower it), when the world has no
/// valid factorization, or when a prediction breaks a physical bound.
bool search(const SearchRequest &req, SearchResult &out, std::string *error);

/// Checks a throughput claim against the device's peak: false with a
/// message giving the TFLOP/s per device it needs when that exceeds the
/// profile's peak.
bool checkThroughputClaim(const ModelDims &m, double samplesPerS, int world,
                          const Profile &p, std::string *error);

/// The ranking as plain lines (the table --mapp-auto-parallel prints).
std::string formatRanking(const SearchRequest &req, const SearchResult &r);

} // namespace mapp::cost

#endif // MAPP_COST_SEARCH_H

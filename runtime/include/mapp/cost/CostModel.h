//===- CostModel.h - the one cost model of mapp (search and simulator) ----===//
//
// Device and network rates (a Profile: measured by `mapp-run --calibrate`,
// or a documented default per device kind), the cluster's topology, and the
// cost primitives every user prices work with: an instruction or an op class
// (FLOPs over the GEMM rate, bytes over the memory bandwidth, plus the
// per-op overhead), a point-to-point message and a ring collective over a
// link class. mapp-sim's plan replay (scan/lib/SimPlan.cpp) and the
// auto-parallel search (mapp/cost/Search.h) call these and nothing else, so
// a calibration changes both at once (docs/auto-parallel.md).
//
// Plain C++17 (no MLIR): the compiler, mapp-sim and mapp-run link it.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_COST_COSTMODEL_H
#define MAPP_COST_COSTMODEL_H

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace mapp::cost {

/// One class of link (inside a node, between nodes).
struct Link {
  double gbps = 100;     // Gb/s, each direction
  double latencyUs = 5;  // per message (and per ring step)
};

/// What a device computes and moves, and its memory.
struct Profile {
  std::string deviceKind = "cpu"; // cpu | a100 | h100 | h200
  std::string source = "default"; // file, or "default (<kind>)"
  /// Dense matrix-product rate per device (TFLOP/s) by compute dtype;
  /// 0 = the backend cannot compute in it.
  double gemmTflopsF32 = 0.1, gemmTflopsBf16 = 0, gemmTflopsFp8 = 0;
  /// GEMM rates by size (`"gemm_rates": {"f32": [[D, T], ...]}`, D
  /// increasing): T TFLOP/s for a product whose smallest dimension is D.
  /// A product between two points gets the log-log interpolation, outside
  /// them the nearer point's rate; a dtype without points, its gemm_tflops
  /// at every size. Why: a CPU core multiplies hidden-32 matrices at half
  /// the rate of hidden-128 ones, and one rate cannot price both
  /// (docs/auto-parallel.md). `mapp-run --calibrate` writes its classes.
  struct RatePoint {
    double dim, tflops;
  };
  std::vector<RatePoint> gemmRatesF32, gemmRatesBf16, gemmRatesFp8;
  /// The data sheet's dense peak (TFLOP/s, the widest dtype the device
  /// trains in): MFU is measured against it, and a prediction above it is
  /// an error, not a result.
  double peakTflops = 0.1;
  /// Fraction of the GEMM rate attention's batched products reach.
  double attentionEfficiency = 0.5;
  /// Attention's score rows go through memory (the CPU kernel's softmax
  /// over a materialized T×T block per head), priced as streamed bytes
  /// beside its FLOPs; on GPUs the fused kernel (cuDNN, flash) keeps them
  /// on chip and its calibrated rate is all of its cost (`"attention_scores":
  /// "memory"` or `"on-chip"`; default by device kind).
  bool attentionScoresInMemory = true;
  double memGBps = 10;       // streaming (elementwise) bandwidth
  /// The activation functions' rate (GELU, SiLU and their gradients: a
  /// tanh or exp per element), G elements/s; 0: their bytes are their
  /// cost. On a CPU core they are compute-bound (~0.08 G/s on the dev VM,
  /// 40% of the calibration model's step), on a GPU bandwidth-bound.
  double activationGelems = 0;
  double opOverheadUs = 5;   // per instruction (dispatch, launch)
  Link intra{50, 10}, inter{10, 20};
  /// Point-to-point messages (pipeline sends) when they travel slower than
  /// collectives, as under `mapp-run --inject link-bandwidth`, which slows
  /// point-to-point transfers only (links.p2p in the file).
  bool haveP2p = false;
  Link p2p;
  /// Device memory (GiB) when the cluster does not say.
  double memoryGiB = 16;
  /// Backend stores activations as bf16 (the CPU stores fp32: no saving).
  bool bf16Storage = false;
  /// Device memory (GiB) the backend holds beside the plan's blocks and
  /// the bf16 weight shadows: library workspaces, loaded kernels, scratch
  /// (`"runtime_reserve_gib"`; the device kind's default, from the peak a
  /// training run measured against its plan: calibration does not
  /// measure it, its own buffers would count).
  double runtimeReserveGiB = 0;
  /// Ranks that share the machine's cores (0: every rank its own device).
  /// The CPU bench runs 8 ranks on a few cores: each then computes at
  /// cores/ranks of the calibrated single-rank rate.
  double sharedCores = 0;
  /// Collectives through shared memory (mapp's thread communicator,
  /// --comm=local: members read each other's buffers between barriers):
  /// a collective costs a fixed number of synchronizations whatever the
  /// group's size, not a ring's 2(n-1) steps (`"collectives":
  /// "shared-memory"`; default "ring").
  bool sharedMemoryCollectives = false;
  /// Waiting ranks keep polling (MPI's progress loop on an oversubscribed
  /// machine): a bubble frees no core for the busy ranks.
  bool busyWait = false;
};

/// The modeled cluster: topology, device kind, memory per device.
struct Cluster {
  std::string deviceKind = "cpu";
  int devicesPerNode = 8;
  int nodes = 0;           // 0: as many as the world needs
  double memoryGiB = 0;    // 0: the profile's
  bool haveIntra = false, haveInter = false;
  Link intra, inter;       // when given, override the profile's
  std::string source;
};

/// The documented default profile of a device kind (docs/auto-parallel.md);
/// false for an unknown kind.
bool defaultProfile(const std::string &kind, Profile &out);
/// The device kinds with a default profile, for messages.
std::string knownDeviceKinds();

/// Parses a profile (`mapp-run --calibrate` output). `name` prefixes every
/// message; an unknown or malformed key is an error naming it
/// ("profile.json: key 'links.inter.gbps': ...").
bool parseProfile(const std::string &text, const std::string &name,
                  Profile &out, std::string *error);
/// Parses a cluster description (same error rules).
bool parseCluster(const std::string &text, const std::string &name,
                  Cluster &out, std::string *error);
/// Reads `path` (a regular file) and parses it.
bool loadProfile(const std::string &path, Profile &out, std::string *error);
bool loadCluster(const std::string &path, Cluster &out, std::string *error);

/// The profile the search and the simulator price with: the cluster's
/// device kind's default unless `profile` (measured) is given, the cluster's
/// links and memory over the profile's. A profile of another device kind
/// than the cluster's is used, with a warning naming both.
Profile effectiveProfile(const Cluster &cluster, const Profile *measured,
                         std::vector<std::string> &warnings);

/// Serializes a profile (the format parseProfile reads).
std::string profileJson(const Profile &p);

enum class DType { F32, BF16, FP8 };
const char *dtypeName(DType d);
/// The GEMM rate of `d` (TFLOP/s), 0 when the device has none.
double gemmTflops(const Profile &p, DType d);
/// The rate of `d` for a product whose smallest dimension is `minDim`
/// (gemm_rates, else gemmTflops).
double gemmTflops(const Profile &p, DType d, double minDim);

/// One matrix product of a priced step: m x k times k x n, `count` times.
struct GemmShape {
  double m = 0, n = 0, k = 0, count = 1;
  double flops() const { return 2 * m * n * k * count; }
  double minDim() const { return std::min(m, std::min(n, k)); }
};

/// The cost primitives (nanoseconds). `ranksSharing`: ranks computing on
/// the same cores at once (1 = a device of its own).
struct Costs {
  const Profile &p;
  explicit Costs(const Profile &p) : p(p) {}
  /// One instruction: max(FLOPs / GEMM rate, bytes / memory bandwidth) +
  /// the per-op overhead (the roofline of each instruction).
  /// `minDim`: a GEMM's smallest dimension (its rate from gemm_rates); 0:
  /// the dtype's gemm_tflops.
  double instrNs(double flops, double bytes, DType d = DType::F32,
                 bool attention = false, double minDim = 0) const;
  /// An activation function over `elements` whose `bytes` are priced
  /// already: what its per-element compute costs beyond them.
  double activationNs(double elements, double bytes) const;
  /// Matrix products at their sizes' rates (no overhead: the caller's
  /// bulkNs counts the ops).
  double gemmNs(const std::vector<GemmShape> &gemms, DType d) const;
  /// A class of ops priced in bulk: FLOPs at the GEMM rate plus streamed
  /// bytes at the memory bandwidth plus `ops` overheads.
  double bulkNs(double gemmFlops, double attentionFlops, double bytes,
                double ops, DType d = DType::F32) const;
  /// A point-to-point message over one link.
  double p2pNs(double bytes, bool sameNode) const;
  /// A ring collective (all-reduce: 2(n-1) steps of bytes/n; all-gather,
  /// reduce-scatter, all-to-all: n-1 steps) over `n` members; with
  /// shared-memory collectives, `sharedMemorySyncs` latencies and the bytes
  /// each member moves (all-reduce: reduces its share reading every member's,
  /// copies all shares back: 2 bytes; the others: bytes once).
  enum class Coll { AllReduce, AllGather, ReduceScatter, AllToAll };
  double collectiveNs(Coll kind, double bytes, int n, bool sameNode) const;
  /// One message over one link: latency + bytes at its bandwidth (the
  /// simulator's per-hop formula too, SimConfig.cpp makeNetwork).
  static double linkNs(const Link &l, double bytes) {
    return l.latencyUs * 1e3 + bytes * 8 / l.gbps; // Gb/s = bits per ns
  }
  /// Steps of the ring algorithm, each moving bytes / n over every hop.
  static double ringSteps(Coll kind, int n) {
    return n <= 1 ? 0 : kind == Coll::AllReduce ? 2.0 * (n - 1) : n - 1.0;
  }
  static double sharedMemorySyncs(Coll kind) {
    // LocalComm.cpp: publish -> barrier -> work -> barrier (all-reduce: a
    // barrier between reducing and copying back too).
    return kind == Coll::AllReduce ? 3 : 2;
  }
  /// How much slower each rank computes because ranks share cores.
  double shareFactor(int ranksOnMachine) const;
};

} // namespace mapp::cost

#endif // MAPP_COST_COSTMODEL_H

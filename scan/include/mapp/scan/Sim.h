//===- Sim.h - Discrete-event replay of a training job ----------*- C++ -*-===//
//
// mapp-sim's engine. Every rank runs a sequential program of ops: compute
// (a duration), send (eager: the sender is busy until its bytes have crossed
// the link; transfers on one directed link are serialized), recv (blocks
// until the matching send's bytes arrive: it ends at max(post, send start +
// queueing + latency + bytes/bandwidth)) and collectives (synchronizing: all
// members leave together at the last arrival plus the transfer time).
// The same engine replays measured traces for mapp-scan --what-if, with the
// measured durations and transfer times in place of the model's.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_SIM_H
#define MAPP_SCAN_SIM_H

#include "mapp/monitor/Summary.h"
#include "mapp/scan/Trace.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mapp::scan {

struct SimOp {
  enum Kind { Compute, Send, Recv, Coll } kind = Compute;
  std::string name;
  Cat cat = Cat::Compute;
  Op op = Op::None;
  Phase phase = Phase::None; // traced as the event's "phase"
  int step = -1, mb = -1, layer = -1, chunk = -1;
  double durNs = 0;      // Compute: duration
  double xferNs = -1;    // Send/Coll: fixed transfer time (replay); <0: model
  double gapNs = 0;      // idle time before the op (replay of host gaps)
  double exitSkewNs = 0; // Coll: this member leaves this much late
  uint64_t bytes = 0;
  int peer = -1;
  int64_t tag = -1;
  int group = -1; // index into SimJob::groups
  int64_t seq = -1;
  int64_t srcId = -1; // replay: the trace event id this op came from
  int32_t peerBytes = -1; // Coll all_to_all: index into SimJob::peerBytes
  /// Send: posted without blocking the sender (a non-blocking isend): the
  /// link carries it after the link's previous transfer's bytes, it
  /// arrives latency + bytes/bandwidth later, and the sender goes on.
  bool async = false;
  /// Send/Recv between two streams of one rank (SimJob::streamOwner): an
  /// event the other stream waits for; no bytes, no time, not traced.
  bool streamSync = false;
};

struct SimGroup {
  std::string kind;
  std::vector<int> members; // sorted
};

/// Transfer-time model (ns) for the engine's modeled ops.
struct SimNetwork {
  std::function<double(int src, int dst, uint64_t bytes)> p2p;
  std::function<double(const SimGroup &, Op, uint64_t bytes)> coll;
};

/// An asynchronous send posted at `start` on a link that is free from
/// `linkFree`: its bytes serialize behind the link's previous transfer, its
/// latency overlaps the next one. Updates `linkFree`; returns the arrival.
inline double postAsyncSend(double start, double &linkFree, double xferNs,
                            double latencyNs) {
  double begin = start > linkFree ? start : linkFree;
  linkFree = begin + (xferNs > latencyNs ? xferNs - latencyNs : 0.0);
  return begin + xferNs;
}

/// A variable all_to_all's bytes to and from each group member (member
/// order), as ep_dispatch / ep_combine trace them.
struct SimPeerBytes {
  std::vector<uint64_t> send, recv;
};

struct SimJob {
  int world = 0, tp = 1, pp = 1, dp = 1;
  /// Per rank; programs beyond `world` are further streams of a rank (a
  /// communication stream beside its compute): program world + k runs on
  /// rank streamOwner[k], in the trace's stream streamName[k]. Their
  /// collectives' groups list programs, not ranks.
  std::vector<std::vector<SimOp>> programs;
  std::vector<SimGroup> groups;
  std::vector<SimPeerBytes> peerBytes; // shared by ops with the same counts
  std::vector<int> streamOwner;
  std::vector<std::string> streamName;
  /// Config mode with memory keys: each rank's modeled peak bytes.
  std::vector<uint64_t> peakBytes;

  int ownerOf(size_t program) const {
    return program < static_cast<size_t>(world)
               ? static_cast<int>(program)
               : streamOwner[program - world];
  }
  /// "" for a rank's first stream.
  const std::string &streamOf(size_t program) const;
  /// The programs that run on rank r: r itself, then its further streams.
  std::vector<size_t> programsOf(int r) const;
  /// (program, op index) of every op of rank r, program by program.
  std::vector<std::pair<size_t, size_t>> opsOf(int r) const;
};

/// A receive's message on the true clock: when its sender called send and
/// when the payload was complete at the receiver (the engine knows both;
/// traces carry them as the recv's `sent`/`arrived`, docs/trace-format.md).
struct SimRecvStamp {
  size_t op; // index of the recv in its program
  double sentNs, arrivedNs;
};

struct SimTimes {
  std::vector<std::vector<std::pair<double, double>>> ops; // begin/end ns
  std::vector<std::vector<SimRecvStamp>> recvs; // per program, in order
};

/// Runs the job. Returns false with a message naming the blocked ops when
/// the programs deadlock (unmatched recv, a collective a member never joins).
bool runSim(const SimJob &job, const SimNetwork &net, SimTimes &out,
            std::string *error);

/// Step time: the mean over steps of (latest end of step s) - (latest end of
/// step s-1), the first step measured from the earliest begin.
std::vector<double> stepTimesNs(const SimJob &job, const SimTimes &times);

//===----------------------------------------------------------------------===//
// The modeled cluster and training job (mapp-sim's JSON config).
//===----------------------------------------------------------------------===//

struct Fault {
  enum Kind { SlowCompute, LinkDelay, LinkBandwidth } kind;
  int rank = -1, src = -1, dst = -1;
  double value = 0; // factor, extra us, or Gb/s
  std::string text;
};

/// Parses `slow-compute:rank=R,factor=F`, `link-delay:src=A,dst=B,us=U`,
/// `link-bandwidth:src=A,dst=B,gbps=G` in mapp-run's grammar
/// (mapp/rt/FaultSpec.h), with ranks below `world`, active every step.
bool parseFault(const std::string &s, int world, Fault &f, std::string *error);

struct SimConfig {
  int tp = 1, pp = 1, dp = 1, microbatches = 1, steps = 1, chunks = 1;
  int layers = 0; // total transformer layers
  /// Layers of each virtual stage (uneven stages, the compiler's
  /// stage-layers=); empty: layers split evenly over pp*chunks.
  std::vector<int> stageLayers;
  /// First layer of virtual stage vs (vs = pp*chunks: the layer count).
  int firstLayer(int vs) const;
  std::string schedule = "1f1b";
  // Per-rank compute (already divided by tp): either microseconds or FLOPs
  // over the device's sustained TFLOP/s.
  double layerForwardUs = 0, layerForwardFlops = 0, deviceTflops = 0;
  double backwardFactor = 2.0;
  double embeddingUs = 0, lossUs = 0, optimizerUs = 0, dataUs = 0;
  uint64_t activationBytes = 0, tpAllreduceBytes = 0, dpAllreduceBytes = 0;
  // Mixture of experts (docs/mapp-sim.md): every layer's MLP is followed by
  // the experts, split over `ep` consecutive dp ranks; member j of an ep
  // group owns experts [j E/ep, (j+1) E/ep) and receives the share of each
  // member's routed rows that `moeExpertLoad` gives its experts.
  int ep = 1, moeExperts = 0;
  uint64_t moeDispatchBytes = 0; // a rank's routed rows, per layer and mb
  double moeExpertUs = 0;        // the experts' forward at a balanced load
  std::vector<double> moeExpertLoad; // per expert, normalized (empty: equal)
  bool gradNormAllreduce = true; // model-parallel all-reduce before the update
  // Megatron's overlap_grad_reduce: the DP all-reduce runs per layer (one
  // bucket each) on a communication stream as the last microbatch's
  // backward of that layer ends, beside the rest of the backward; the
  // update waits for it.
  bool overlapGradReduce = false;
  // Context parallelism (docs/mapp-sim.md, "Context parallelism"): the
  // sequence is split over `cp` consecutive dp ranks (cp lives inside dp,
  // as in mapp's plans); with cp or an attention cost, the per-rank values
  // above describe the job at cp = 1 (one rank holds the whole sequence)
  // and the position-local work and messages are divided by cp, while the
  // causal attention core runs as a ring of K/V blocks or between two
  // all-to-alls.
  int cp = 1;
  std::string cpComm = "ring";
  int64_t seqLen = 0, batchRows = 1;
  int heads = 0, kvHeads = 0, headDim = 0, dtypeBytes = 2;
  double attentionForwardUs = 0, attentionTflops = 0;
  double attentionBackwardFactor = 0; // 0: backwardFactor
  bool recomputeFull = false; // full activation recomputation
  // Memory (optional): persistent bytes per rank, the activations one layer
  // stashes per microbatch and the transient working set (both at cp = 1).
  uint64_t persistentBytes = 0, layerStashBytes = 0, workingBytes = 0;
  int gpusPerNode = 0;           // ranks r/gpusPerNode share a node; 0 = tp
  double interGbps = 100, interLatencyUs = 5;
  double intraGbps = 1800, intraLatencyUs = 2;
  double clockOffsetMs = 0, clockDriftPpm = 0, wallErrorMs = 0;
  double jitter = 0, exitSkewUs = 0;
  uint64_t seed = 1;
  std::vector<Fault> faults;

  double layerForwardNs() const;
  /// The layer's causal attention core, forward, over the whole sequence
  /// (cp = 1), per rank after tp: 0 when not modeled.
  double attentionForwardNs() const;
  /// Bytes of one rank's K and V block (its S/cp tokens, kv_heads/tp heads).
  uint64_t kvBlockBytes() const;
  /// Bytes of one rank's share of a tensor with `h` heads (per rank after tp).
  uint64_t headsShareBytes(int h) const;
  /// Fraction of the causal (query, key) pairs of the sequence that cp
  /// member `member`'s two chunks have against member `src`'s keys under
  /// the load-balanced layout (chunks r and 2cp-1-r).
  double causalPairShare(int member, int src) const;
  /// Peak memory of a rank at pipeline stage s (0 without memory keys).
  uint64_t peakBytes(int stage) const;
};

bool parseSimConfig(const std::string &jsonText, SimConfig &c,
                    std::string *error);

/// Builds every rank's program (with jitter and slow-compute faults applied).
bool buildSimJob(const SimConfig &c, SimJob &job, std::string *error);
/// The cluster model with link faults applied.
SimNetwork makeNetwork(const SimConfig &c);

struct SimClock {
  double offsetNs, driftPpm; // local = offset + (1 + drift) * true
  double wallErrorNs;
};
std::vector<SimClock> makeClocks(const SimConfig &c);

/// The true exposed communication of a simulated job (mapp/monitor/
/// Exposure.h on the engine's times): per rank and class, per step mean,
/// as sim-truth.json's "exposed_comm" (docs/mapp-sim.md).
nlohmann::json simExposureTruth(const SimJob &job, const SimTimes &times);

/// Writes DIR/rank-*.trace.jsonl (through MappTraceWriter) and
/// DIR/sim-truth.json (clocks, faults, step times, exposed communication).
bool writeSimTraces(const std::string &dir, const SimConfig &c,
                    const SimJob &job, const SimTimes &times,
                    std::string *error);

/// The live monitor's step summaries of the simulated job (what each rank
/// would send the monitor rank), step-major: step 0 of every rank, then
/// step 1, ... (mapp-sim --summaries FILE; docs/mapp-scan.md).
bool simSummaries(const SimConfig &c, const SimJob &job, const SimTimes &times,
                  std::vector<mapp::monitor::StepSummary> &out,
                  std::string *error);

/// Deterministic uniform/normal draws keyed by (seed, a, b).
double hashUniform(uint64_t seed, uint64_t a, uint64_t b);
double hashNormal(uint64_t seed, uint64_t a, uint64_t b);

} // namespace mapp::scan

#endif // MAPP_SCAN_SIM_H

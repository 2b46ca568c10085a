//===- Summary.h - A rank's step reduced to a fixed-size record -*- C++ -*-===//
//
// MegaScan live (docs/mapp-scan.md, "Live monitor"): every rank reduces each
// training step to one StepSummary -- compute time per op class (thread CPU
// time where measured, wall time always), time at each kind of sync point,
// bytes and wire time per P2P source, and on CUDA the GPU's clock, power,
// temperature and throttle reasons. The record is trivially copyable and of
// one size, so it travels over the job's own communicator as raw bytes and
// a monitor holds a window of them in bounded memory.
//
// The Summarizer builds summaries from trace events, whoever produced them:
// the runtime (a tap on its trace writer), mapp-scan --follow (events read
// back from growing trace files) and mapp-sim (simulated jobs). Standard
// library only: the bottom of the stack, below runtime/ and scan/.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_SUMMARY_H
#define MAPP_MONITOR_SUMMARY_H

#include "mapp/monitor/Exposure.h"
#include "mapp/trace/TraceFormat.h"
#include "mapp/trace/TraceWriter.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace mapp::monitor {

// The record's layout version: a monitor refuses records of another layout
// (MSM4: stamp counts per source and the step's anchor; MSM3:
// PeerStats.minWireLoNs; MSM2 added the exposed communication per class
// and the step's span).
constexpr uint32_t kSummaryMagic = 0x4d534d34; // "MSM4"

/// Op classes: the trace categories that are not communication.
enum OpClass : int { ClassCompute, ClassOptimizer, ClassData, ClassMemcpy,
                     kOpClasses };
/// Sync points: collectives by the group kind they run over, and receives.
enum SyncClass : int { SyncTp, SyncDp, SyncPp, SyncOther, SyncRecv,
                       kSyncClasses };
const char *opClassName(int c);
const char *syncClassName(int c);

/// Receives from one source rank in one step.
struct PeerStats {
  int32_t peer = -1;
  uint32_t count = 0;
  uint64_t bytes = 0;
  /// Fastest and total wire time: with `stamped` samples, arrived - sent
  /// of those receives only (the payload complete here on this rank's
  /// clock minus the send call on the sender's: across hosts the clocks'
  /// offset is in it, and the value may be negative -- the diagnoser takes
  /// it out with the step's anchor collective); without stamps the
  /// receives' spans (-1: none measured).
  double minWireNs = -1, sumWireNs = 0;
  /// What the fastest waited-for transfer took at least: minWireNs where
  /// landings are exact, less where a poll only bounds them (MPI:
  /// `pendingNs`). Without stamps -1: no receive waited for its payload;
  /// with them signed as minWireNs, valid when `stampedLo` > 0.
  double minWireLoNs = -1;
  uint32_t stamped = 0;   // receives that carried sent/arrived stamps
  uint32_t stampedLo = 0; // ... of which bounded the transfer from below

  bool hasWire() const { return stamped > 0 || minWireNs >= 0; }
  bool hasWireLo() const {
    return stamped > 0 ? stampedLo > 0 : minWireLoNs >= 0;
  }
};

constexpr int kMaxPeers = 8;
/// Compute ops by a hash of their name: a slow device slows every kind of
/// op, host noise (cache contention, another job's burst) a few.
constexpr int kOpBuckets = 16;
int opBucketOf(const char *name);

struct StepSummary {
  enum Flags : uint16_t {
    HasCpu = 1,   // every compute op carried its thread CPU time
    HasWire = 2,  // receives carried sent/arrived stamps
    HasNvml = 4,  // the GPU fields below were read
    BusyHost = 8, // the rank's host ran more ranks than its process's CPUs
  };
  uint32_t magic = kSummaryMagic;
  int32_t rank = -1;
  int32_t step = -1;
  int16_t tp = 0, dp = 0, pp = 0;
  uint16_t flags = 0;
  uint32_t host = 0; // hash of the host name (links within / across hosts)
  uint32_t events = 0;
  double cpuNs[kOpClasses] = {0, 0, 0, 0};
  double wallNs[kOpClasses] = {0, 0, 0, 0};
  uint32_t ops[kOpClasses] = {0, 0, 0, 0};
  double bucketNs[kOpBuckets] = {}; // CPU time where measured, else wall
  uint32_t bucketOps[kOpBuckets] = {};
  double syncNs[kSyncClasses] = {0, 0, 0, 0, 0};
  uint32_t syncOps[kSyncClasses] = {0, 0, 0, 0, 0};
  PeerStats recvFrom[kMaxPeers];
  uint8_t recvPeers = 0;
  uint8_t peerOverflow = 0; // sources beyond kMaxPeers (not recorded)
  uint16_t reserved = 0;
  // NVML (HasNvml): SM clock now and its maximum, board power, GPU
  // temperature, nvmlClocksThrottleReasons bits.
  float smClockMhz = -1, smClockMaxMhz = -1, powerW = -1, temperatureC = -1;
  uint64_t throttleReasons = 0;
  // Communication per class (Exposure.h): its time, and the part of it
  // with none of the rank's compute beside it, within this step's events.
  float commClassNs[kCommClasses] = {};
  float exposedNs[kCommClasses] = {};
  float spanNs = 0; // the step's first begin to last end on this rank
  // The step's anchor: the collective that ended last in it (the gradient
  // norm's or the metrics' all-reduce over the model-parallel group or the
  // world), its end on this rank's clock and a key naming the instance
  // (group kind, members, seq). Members of one collective leave it
  // together, so two ranks with the same key give their clocks' offset:
  // what stamped wire times between hosts need. anchorKey 0: none.
  uint32_t anchorKey = 0;
  uint32_t reserved2 = 0;
  double anchorEndNs = 0;

  /// Compute cost of the rank's step: CPU time when measured, else wall.
  double computeNs(bool cpu) const;
  double totalSyncNs() const;
  double totalExposedNs() const;
};
static_assert(std::is_trivially_copyable<StepSummary>::value,
              "summaries travel as raw bytes");

/// One trace event, whatever wrote it (times in ns on one rank clock).
struct SummaryEvent {
  const char *name = ""; // op name (buckets)
  int step = -1;
  trace::Category cat = trace::Category::Compute;
  trace::Op op = trace::Op::None;
  int group = -1; // collectives: the group id (kind via setGroupKind)
  int64_t seq = -1; // collectives: the per-group instance number
  int peer = -1;
  uint64_t bytes = 0;
  uint64_t beginNs = 0, endNs = 0;
  uint64_t cpuNs = 0;               // 0: not measured
  uint64_t sentNs = 0, arrivedNs = 0; // recv stamps; 0: unknown
  uint64_t pendingNs = 0;     // the landing is after this (if not exact)
  bool arrivalExact = true;
  bool wireUnknown = false; // recv: neither stamps nor a usable span
  uint32_t track = 0;       // trackOf(stream): 0 = the rank's host thread
};

/// The summary's view of a trace record: the runtime's own (its writer's
/// tap) or one read back from a trace line (traceRecordOf). `name` points
/// into the record.
SummaryEvent summaryEventOf(const TraceRecord &r);

uint32_t hostHash(const std::string &host);
SyncClass syncClassOfGroupKind(const std::string &kind);

/// Builds one rank's summaries, step by step. Thread-safe: the runtime's
/// records may come from the training thread and a trace resolver thread.
class Summarizer {
public:
  void setIdentity(int rank, int tp, int dp, int pp, const std::string &host);
  /// A communicator's kind and members (members name the instance for
  /// the step's anchor; empty: the kind alone, as for the world).
  void setGroupKind(int group, const std::string &kind,
                    const std::vector<int> &members = {});
  /// The job's degrees (Megatron order): a send/recv's pipeline direction
  /// comes from its peer's stage. Without them it is `p2p`.
  void setLayout(int tpSize, int dpSize, int ppSize);
  void add(const SummaryEvent &e);
  /// The summary of `step` (an empty one if it saw no events); forgets it
  /// and every older step.
  StepSummary take(int step);
  /// Steps with events not taken yet, ascending.
  std::vector<int> openSteps();

private:
  StepSummary fresh(int step) const;
  int p2pClassOf(const SummaryEvent &e) const;
  std::mutex mu_;
  StepSummary identity_;
  int tpSize_ = 0, dpSize_ = 0, ppSize_ = 0;
  std::map<int, SyncClass> groupClass_;
  std::map<int, CommClass> groupCommClass_;
  std::map<int, uint32_t> groupHash_; // kind and members
  std::map<int, StepSummary> open_;
  // The open steps' events, for their exposure at take().
  std::map<int, std::vector<ExposureEvent>> timeline_;
};

/// A summaries file: the raw records back to back (as they travel), in
/// the order a monitor would receive them. False with *error naming the
/// path on I/O failure or a record that is not a summary.
bool writeSummaries(const std::string &path,
                    const std::vector<StepSummary> &records,
                    std::string *error);
bool readSummaries(const std::string &path, std::vector<StepSummary> &out,
                   std::string *error);

} // namespace mapp::monitor

#endif // MAPP_MONITOR_SUMMARY_H

//===- Elastic.h - a job that restarts itself without its lost ranks -*- C++ -*-===//
//
// The state machine behind `mapp-run --elastic` (rank threads) and
// `mapp-launch --elastic -- mpirun ... mapp-run ...` (processes); both only
// run attempts and report how each ended, ElasticJob decides
// (docs/elastic.md):
//
//   RUN(layout L, resume C) --exit 0, all steps--------------------> DONE
//   RUN --a rank lost (died, killed, hung)--> SHRINK: ranks left -= lost;
//          the largest given layout that fits (dp shrinks first) and the
//          newest intact checkpoint (a damaged one is set aside, named) -> RUN
//   RUN (shrunk) --ranks returned, checkpoint saved at or after it--> GROW:
//          the largest layout that fits again, from that checkpoint -> RUN
//   RUN --a checkpoint where another partition of the stages wins--->
//          REPARTITION: the same layout, layers moved (Rebalancer) -> RUN
//   any other failure, no layout fits, too many restarts -------> FAILED
//
// Layouts are plans the user compiled (the runtime never compiles); every
// one must keep the global batch (dp x microbatches x micro-batch size), so
// a smaller dp accumulates more microbatches and the data position (samples
// step*G .. step*G+G-1) continues exactly through the existing resume path.
// Each decision is one line on stderr and one JSON line in the monitor file.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_ELASTIC_H
#define MAPP_RT_ELASTIC_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mapp::rt {

/// One layout an elastic job may run in: a compiled plan.
struct ElasticLayout {
  std::string plan;
  int world = 1, tp = 1, pp = 1, dp = 1;
  int microbatches = 1;
  int64_t samplesPerStep = 0; // dp x microbatches x micro-batch size
  std::string text() const;   // "tp 2 x pp 2 x dp 1 (4 ranks, 4 microbatches)"
};

/// Reads the plan's layout (Error when it does not load).
ElasticLayout describePlan(const std::string &path);

/// The job's own plan first, then the others it may switch to. Error when
/// one is not a plain tp x pp x dp layout or changes the global batch.
std::vector<ElasticLayout> elasticLayouts(const std::vector<std::string> &plans);

/// The layout to run on `ranks` ranks: the largest world that fits; among
/// equals the one keeping `current`'s tp and pp (dp shrinks first), then
/// the one with more dp. Null when none fits.
const ElasticLayout *chooseLayout(const std::vector<ElasticLayout> &layouts,
                                  int ranks, const ElasticLayout &current);

/// "" when `folder` is an intact checkpoint (manifest sealed, every shard
/// its recorded size and CRC-32), else what is wrong with it.
std::string checkpointDamage(const std::string &folder);

struct ResumePoint {
  std::string folder; // "" = none: start from step 0
  int64_t step = 0;
  std::vector<std::string> setAside; // "step-N: why -> renamed to ..."
};
/// The newest intact checkpoint of `saveDir`. Damaged newer ones are renamed
/// `step-N.damaged` (kept for inspection, out of the resume path and of
/// retention) and listed.
ResumePoint newestIntactCheckpoint(const std::string &saveDir);

/// Keeps only the JSONL lines of `path` whose "step" is below `step` (the
/// metrics and batch dumps of the steps a restart runs again). No file: no-op.
void trimJsonlSteps(const std::string &path, int64_t step);

/// Ranks a failure text names as gone: "rank R died", "rank R did not
/// answer", mpirun's "process rank R ... exited on signal". Sorted, unique.
std::vector<int> lostRanksIn(const std::string &text);

struct Plan;

/// Layers (`layers.N.*` parameters) held by each pipeline stage of `plan`.
std::vector<int> stageLayerCounts(const Plan &plan);

/// An elastic decision: one stderr line "TOOL: elastic: LINE" (none when
/// LINE is empty: a window that stays is logged to the monitor alone) and
/// the JSON line appended to the --monitor file ("-": stdout; "": none).
void reportDecision(const std::string &tool, const std::string &monitor,
                    const std::string &line, const std::string &jsonLine);

/// The stage partitions of one layout a job may switch between: the job's
/// plan first, then the others (repeats dropped), and each one's layers per
/// stage. Error naming a plan of another layout, or a layout with no
/// pipeline.
struct PartitionSet {
  std::vector<std::string> plans;
  std::vector<std::vector<int>> layers;
  int home = 0; // the partition the job was started on (Rebalancer::setHome)
  int indexOf(const std::string &plan) const; // -1: not one of them
};
/// `homePlan`: the plan the job started on when it is not `jobPlan` (an
/// attempt of mapp-launch after a switch; empty: `jobPlan` is home).
PartitionSet loadPartitionSet(const std::string &jobPlan,
                              const std::vector<std::string> &others,
                              const std::string &homePlan = "");

/// mapp-run under mapp-launch reports a re-partition on stderr, one line
/// (rank 0, as the job's last words): "mapp-run: elastic-report " + JSON
/// with "switch_to" (the plan) and "evidence" (Rebalancer::decide's), and
/// "window_step_ms" (the attempt's first window, for the measured gain).
constexpr const char *kElasticReportTag = "mapp-run: elastic-report ";
struct ElasticReport {
  std::string switchTo, evidence;
  double windowStepMs = 0;
};
std::string formatElasticReport(const ElasticReport &r);
/// The last report in `text` (a process's stderr); empty if none.
ElasticReport lastElasticReport(const std::string &text);

/// Re-partitioning (docs/elastic.md): every rank feeds it each step's
/// compute time of every rank (thread CPU time, all-reduced) and the part
/// of it spent in layers' instrs, and at a checkpoint it says whether
/// another of the given partitions of the same layout would be faster. Per
/// step, the stage time T_s is its slowest rank's, of which L_s in layers;
/// a layer of stage s costs L_s / n_s (n_s its layers now), the rest
/// F_s = T_s - L_s is the stage's own (embedding, head, p2p), and a
/// partition m is predicted to take max_s F_s + L_s / n_s * m_s. The
/// target is the partition with the lowest median prediction over the
/// window (of those within 10% of it, the one moving the fewest layers); it
/// switches only if the target beats the current partition in at least
/// `persist` of the window's steps with a median predicted gain of at least
/// `minGain`: a straggler that comes and goes every step moves nothing; one
/// that ends moves the layers back. Going back to the job's home partition
/// (setHome) needs only kHomeGain: a two-level trigger, whose hysteresis
/// is the gap between the bars (away: a fault must pay 1.15x; home: the
/// compiler's partition for healthy stages, 1.05x; on the device host of
/// 2026-12-06 the way back from 4,2,5,5 was predicted near 1.2x and its
/// window stayed below 1.15 on a drifting host).
constexpr double kHomeGain = 1.05;

/// One group's compute in one step, in seconds: the whole, and the part
/// in units that can move (a stage's layers, a replica's microbatches).
struct GroupTime {
  double total = 0, units = 0;
};

class Rebalancer {
public:
  Rebalancer(std::vector<std::vector<int>> partitions, int current, int pp,
             int tp, int dp, double minGain = 1.15, double persist = 0.8);
  /// Compute seconds of every rank in one step (world entries), and of
  /// them the seconds in layers' instrs (empty: all of it).
  void addStep(const std::vector<double> &rankSeconds,
               const std::vector<double> &rankLayerSeconds = {});
  /// At a checkpoint: the partition to switch to (-1: stay); the window is
  /// cleared. `evidence` receives the measured stage times and the gain.
  int decide(std::string *evidence);
  /// The last decided window's median slowest-stage compute per step, in
  /// seconds (0 before a window with steps).
  double lastStepSeconds() const { return lastStep_; }
  /// The partition the job started on (an index of `partitions`; -1, the
  /// default: none, every move needs minGain).
  void setHome(int index) { home_ = index; }

private:
  std::vector<std::vector<int>> parts_;
  int current_, pp_, tp_, dp_, home_ = -1;
  double minGain_, persist_;
  double lastStep_ = 0;
  std::vector<std::vector<GroupTime>> stageTimes_; // per step, per stage
};

/// The uneven data-parallel split (docs/elastic.md): the same rule as
/// Rebalancer with microbatches moving between dp replicas (pp = 1 plans),
/// in place at any step. A replica's time is its slowest tp rank's compute,
/// of which the microbatches' blocks are the part that moves (the
/// optimizer's is fixed). Candidates: the split now, the even split, and
/// each step's best split (greedy: each next microbatch where the
/// replica's predicted time after it is lowest, at least one each). The
/// even split is home (kHomeGain).
class DpBalancer {
public:
  DpBalancer(int dp, int tp, int microbatches, double minGain = 1.15,
             double persist = 0.8);
  void setSplit(std::vector<int> split);
  const std::vector<int> &split() const { return split_; }
  /// Compute seconds of every rank in one step, and of them the seconds in
  /// the microbatches' blocks.
  void addStep(const std::vector<double> &rankSeconds,
               const std::vector<double> &rankMbSeconds);
  /// At the end of a window: 1 if split() changed, 0 if not; the window is
  /// cleared.
  int decide(std::string *evidence);
  static std::vector<int> bestSplit(const std::vector<GroupTime> &t,
                                    const std::vector<int> &now, int total);

private:
  int dp_, tp_, total_;
  double minGain_, persist_;
  std::vector<int> split_;
  std::vector<std::vector<GroupTime>> times_; // per step, per replica
};

/// How one attempt is to run.
struct ElasticAttempt {
  int index = 0; // 0 = the first
  ElasticLayout layout;
  std::string resume;            // checkpoint folder ("" = fresh or as asked)
  int64_t resumeStep = 0;
  int64_t stopAtSaveFrom = -1;   // stop after the first save at >= this step
};

/// How an attempt ended.
struct AttemptEnd {
  int status = 0;
  std::vector<int> lost; // ranks of the attempt's world that are gone
  std::string why;       // the failure's first line
};

class ElasticJob {
public:
  struct Options {
    std::vector<std::string> plans; // the job's own first
    std::string saveDir, metrics, monitor, dumpBatches;
    int64_t steps = 0;
    int maxRestarts = 8;
    std::string tool = "mapp-run"; // stderr prefix
  };
  explicit ElasticJob(Options o);

  const ElasticAttempt &attempt() const { return attempt_; }
  /// Ranks that are back from step `step` on (a rank-crash's back-at-step,
  /// a spare given): the job grows at the first checkpoint at or after it.
  void ranksReturnAt(int64_t step, int n);
  /// Ranks that are back now (mapp-launch: SIGUSR1); the running attempt is
  /// being asked to checkpoint and stop, the job then grows from there.
  void ranksReturnNow(int n) { ranksReturnAt(0, n); }
  /// Decides after an attempt; true: run attempt() (the next one), false:
  /// the job is over with exitStatus().
  bool next(const AttemptEnd &end);
  /// The attempt ended at a checkpoint to switch to `plan` (the same layout,
  /// other stages): restart on it from that checkpoint.
  void repartition(const std::string &plan, const std::string &evidence);
  /// The attempt after a repartition measured `stepMs` (the first window's
  /// median slowest-stage compute per step) where the repartition's
  /// evidence had measured and predicted its own: the measured gain, one
  /// stderr line and one JSON line ("repartition-measured").
  void measuredAfterRepartition(const std::string &evidence, double stepMs);
  int exitStatus() const { return exitStatus_; }

private:
  void decide(const char *decision, const std::string &line,
              const std::string &json);
  bool restartOn(const ElasticLayout &to, const char *decision,
                 const std::string &reason, const std::vector<int> &lost);
  int64_t pendingReturnStep() const;

  Options o_;
  std::vector<ElasticLayout> layouts_;
  ElasticAttempt attempt_;
  int ranks_ = 0; // ranks the job has now
  std::vector<std::pair<int64_t, int>> returns_;
  std::vector<int> lostSoFar_; // "rank R of attempt A", for the last message
  std::vector<std::string> lostNames_;
  int exitStatus_ = 0;
};

} // namespace mapp::rt

#endif

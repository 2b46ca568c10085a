//===- Executor.h - runs one rank's program ---------------------*- C++ -*-===//
//
// Storage: a persistent pool (Param, Grad, OptState at their plan offsets)
// and `slots` arenas of arena_bytes (Temp, Input, Loss; microbatch m uses
// slot m % slots). A training step zeroes the Grad values, runs the tasks the
// scheduler hands out (mapp/rt/Scheduler.h: the table in order, or MegaDPP's
// adaptive choice; filling the Input values of a microbatch the first time a
// task of it touches its slot), computes the global gradient norm, runs the
// Optimizer block(s) once and advances the step counter.
//
// Several ranks: the communicator's layout is set from the plan (Megatron
// order); the step's loss, tokens and squared gradient norm are summed over
// the world in one all-reduce when the gradients are complete (see
// runtime/README.md, "Multi-rank"); sharded parameters are sliced from /
// gathered to full tensors by initParams/loadParams/gatherParams.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_EXECUTOR_H
#define MAPP_RT_EXECUTOR_H

#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/ExpertTally.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/Scheduler.h"
#include "mapp/rt/StepGraph.h"

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace mapp {
class MappTraceWriter;
struct TraceRecord;
}

namespace mapp::rt {

class TraceSink;

struct StepResult {
  int64_t step = 0; // 0-based index of the step just run
  double loss = 0;  // mean of the microbatch losses (nan if none)
  double gradNorm = 0;
  double lr = 0;      // scheduled lr of the step (first optimizer instr)
  int64_t tokens = 0; // tokens consumed by this rank
  /// World-wide figures (equal to the above on one rank): the mean over
  /// every microbatch loss of the last pipeline stage (tp index 0 ranks, all
  /// dp ranks) and the tokens of the global batch.
  double globalLoss = 0;
  int64_t globalTokens = 0;
  bool lossKnown = false; // some rank of the world computed a loss
  /// The optimizer did not run: the global loss or gradient norm was not
  /// finite and setSkipNonFinite is on (parameters and state untouched).
  bool skipped = false;
  /// Loss scaling: the scale this step ran with (1 without), and whether
  /// its scaled gradients overflowed (dynamic: the step is skipped).
  double lossScale = 1;
  bool overflow = false;
  /// Rows per expert of each MoE layer on this rank, summed over the
  /// microbatches (empty unless setCountExperts).
  ExpertTokens expertTokens;
};

/// Loss-scaling state (plan: the loss_scale* attrs of the optimizer instrs,
/// written by --mapp-mixed-precision): the scale of the next step and the
/// finite steps since it last changed.
struct LossScaleState {
  double scale = 1;
  int64_t goodSteps = 0;
};

/// Whether the step's global gradient norm and (when known) loss are finite;
/// every rank of the world sees the same answer (both are all-reduced).
bool stepFinite(const StepResult &r);

class Executor {
public:
  /// Fills tokens/targets ([micro_batch_size, seq_length] each) of
  /// microbatch `mb` of step `step`.
  using BatchFn = std::function<void(int64_t step, int mb, int32_t *tokens,
                                     int32_t *targets)>;
  /// Called with the executor once a step's gradients are complete, before
  /// the optimizer block runs.
  using GradHook = std::function<void(Executor &)>;

  Executor(const Plan &plan, Backend &backend, Communicator &comm);
  ~Executor();
  Executor(const Executor &) = delete;
  Executor &operator=(const Executor &) = delete;

  const Program &program() const { return *prog_; }
  const Plan &plan() const { return plan_; }

  /// Every Param initialized by initParam(name, full shape, seed) and, when
  /// sharded, cut to this rank's piece.
  void initParams(uint64_t seed);
  /// Every Param read by name from `st` (full tensors; sharded params are
  /// sliced); missing or mis-shaped -> Error.
  void loadParams(const Safetensors &st, const std::string &where);
  /// This rank's Params as stored (pieces of sharded ones).
  Safetensors saveParams() const;
  /// Grad values by their parameter's name (this rank's pieces).
  Safetensors saveGrads() const;
  /// Collective over the world (every rank calls it): full tensors of every
  /// parameter (grads = true: of every Grad, keyed by the parameter name),
  /// assembled on rank 0; other ranks get an empty Safetensors.
  Safetensors gatherParams(bool grads = false);

  /// Records the step's events into `w` (not owned; null = off, after
  /// appending what is still held). Plans with trace_begin/trace_end instrs
  /// record those regions in the sampled steps (plan trace_every /
  /// trace_window, or setTraceSampling); plans without record every instr.
  /// With a backend of deferred marks (CUDA events) a step's events reach
  /// `w` after the step, from a resolver thread: detach (null) or
  /// flushTrace() before closing `w`.
  void setTraceWriter(mapp::MappTraceWriter *w);
  /// Overrides the plan's trace_every / trace_window for plans with trace
  /// instrs: steps with step % every < window are traced (every = 0: all).
  void setTraceSampling(int every, int window);
  /// Plans without trace instrs: one record per run of compute ops between
  /// communication ops instead of one per op. The live monitor on a device
  /// backend asks for it: every record costs events on the stream, and a
  /// device's slowdown shows in whole runs as well as in single ops.
  void setTraceComputeRuns(bool on) { computeRuns_ = on; }
  /// No records while paused (the steps mapp-run --monitor-cost leaves
  /// unmonitored), whatever the sampling says.
  void setTracePaused(bool paused) { tracePaused_ = paused; }
  /// Blocks until every event of the steps run so far is in the writer.
  void flushTrace();
  /// Upper bound of the trace events one step records (ring sizing).
  size_t traceEventsPerStep() const;
  /// MegaFBD: run the step-end parameter transfers through the
  /// coordinator (default: on for split plans).
  void setCoordinator(bool on) { coordinator_ = on; }
  /// Fault injection: sleep (factor-1) x each compute instr's time.
  void setSlowCompute(double factor) { slowFactor_ = factor; }
  /// Re-partitioning: add up the thread CPU time of the compute instrs,
  /// and apart those that are a layer's work (workLayers()), so a stage's
  /// per-layer cost is told from its fixed costs (embedding, head and
  /// loss, the optimizer of non-layer parameters). Communication is in
  /// neither: its cost does not move with the layers, and a process
  /// polling MPI while it waits burns CPU that is no stage's work.
  void setTimeCompute(bool on) { timeCompute_ = on; }
  /// The compute instrs' CPU time since the last call, of it the layers'
  /// and that of the microbatches' blocks (all but the optimizer's; 0
  /// unless setTimeCompute).
  uint64_t takeComputeCpuNs() { return std::exchange(computeCpuNs_, 0); }
  uint64_t takeLayerCpuNs() { return std::exchange(layerCpuNs_, 0); }
  uint64_t takeMicrobatchCpuNs() { return std::exchange(mbCpuNs_, 0); }

  /// An uneven data-parallel split (docs/elastic.md): this rank runs `k`
  /// microbatches a step instead of the plan's. The loss is seeded 1/M per
  /// microbatch and the gradients averaged over dp, so any split whose
  /// counts sum to dp x M gives the even split's gradient. Error unless
  /// the task table runs microbatch after microbatch (pp = 1), the
  /// scheduler is static and k in [1, kMaxMicrobatches]. Steps run eagerly
  /// (no CUDA graph).
  void setMicrobatches(int k);
  int microbatches() const {
    return microbatches_ ? microbatches_ : plan_.numMicrobatches;
  }

  /// MegaDPP: the task scheduler (runtime/src/sched). The constructor
  /// installs the plan's default (adaptive for schedule "adaptive", else
  /// static); Error when the plan cannot serve `o`.
  void setScheduler(const SchedOptions &o);
  SchedStats schedStats() const { return sched_->stats(); }
  TaskScheduler &scheduler() { return *sched_; }
  /// Policy switches since the last call (also instant events in the trace).
  std::vector<SchedSwitch> takeSchedSwitches() {
    std::vector<SchedSwitch> s;
    s.swap(pendingSwitches_);
    return s;
  }

  StepResult step(const BatchFn &batches, const GradHook &afterGrads = {});
  int64_t stepsDone() const { return step_; }

  // Checkpoints and non-finite values (ExecutorState.cpp; the checkpoint
  // files themselves: mapp/rt/Checkpoint.h).
  /// This rank's Params (by name) and OptStates (by their value name) as
  /// stored: pieces of sharded ones.
  Safetensors saveState() const;
  /// Every Param and OptState from `st`: pieces = true, this rank's pieces
  /// as saveState wrote them; false, full tensors, cut like --weights.
  /// Missing or mis-shaped -> Error naming `where`.
  void loadState(const Safetensors &st, bool pieces, const std::string &where);
  /// The next step's index (resume: the checkpoint's step).
  void setStepsDone(int64_t s) { step_ = s; }
  /// Leave the optimizer out of a step whose global loss or gradient norm is
  /// not finite (StepResult::skipped).
  void setSkipNonFinite(bool on) { skipNonFinite_ = on; }
  /// After every compute instr, check its outputs: the first non-finite
  /// element throws an Error naming the instr (IR name, kernel, layer).
  void setCheckFinite(bool on) { checkFinite_ = on; }
  /// Fault injection (tests): at step `step`, the instr named `op` writes a
  /// NaN into element 0 of its first output, after it ran (CPU: f32 storage).
  void setInjectNan(int64_t step, std::string op) {
    nanStep_ = step;
    nanOp_ = std::move(op);
  }
  /// "none", "static" or "dynamic" (the plan's loss scaling).
  const std::string &lossScaleMode() const { return lsMode_; }
  LossScaleState lossScaleState() const { return ls_; }
  void setLossScaleState(LossScaleState s) { ls_ = s; }
  /// The first Param holding a non-finite element ("" if none).
  std::string firstNonFiniteParam() const;
  /// This rank's Param or OptState `tensor`, non-finite after a step that
  /// updated it, in the words of the per-op check: "op 'X' (kernel K) wrote
  /// nan to tensor 'T' at element i of n" (the op: the last instr that
  /// writes it, its optimizer update).
  std::string describeNonFinite(const std::string &tensor) const;

  /// MegaScope: probe sink and perturbation switches for later kernels
  /// (null = off). Not owned.
  /// Samples a device backend still captures go to the old runtime first.
  void setProbeRuntime(ProbeRuntime *p) {
    backend_.drainProbes();
    probe_ = p;
  }
  /// Waits until every probe sample taken so far reached the ProbeRuntime.
  void drainProbes() { backend_.drainProbes(); }
  /// Runs every Forward block once as microbatch 0 in slot 0 on the given
  /// tokens/targets ([micro_batch_size, seq_length]) with the kernel step
  /// `step`, leaving gradients, optimizer state and the step counter alone:
  /// generation and evaluation read activations afterwards.
  void runForward(const int32_t *tokens, const int32_t *targets, int64_t step);
  /// Runs block `block` once as microbatch 0 in slot 0 with the kernel step
  /// `step` on whatever its Input values hold (the KV-cache decoder fills
  /// them itself).
  void runBlockOnce(int block, int64_t step);

  Backend &backend() const { return backend_; }
  Communicator &comm() const { return comm_; }
  ProbeRuntime *probeRuntime() const { return probe_; }

  /// Float view of value `v` in `slot` (pool values ignore the slot).
  float *valueData(int v, int slot = 0) const;
  /// `n` elements of float value `v` in `slot` from element `offset`, read
  /// to the host as fp32 whatever the backend stores (bf16 on CUDA).
  std::vector<float> readFloats(int v, int slot, int64_t offset,
                                int64_t n) const;
  /// The inverse of readFloats (activation patching writes a value).
  void writeFloats(int v, int slot, int64_t offset, const float *src,
                   int64_t n);
  /// Called after each instr of a block run by runForward/runBlockOnce
  /// (slot 0) has executed: activation patching reads or rewrites the
  /// instr's outputs there. Null = off; not called for training steps.
  using InstrHook = std::function<void(Executor &, const Instr &)>;
  void setInstrHook(InstrHook h) { instrHook_ = std::move(h); }
  /// Read every moe_assign's counts into StepResult::expertTokens (one
  /// host read per MoE layer and microbatch).
  void setCountExperts(bool on) { countExperts_ = on; }
  /// MAPP_CUDA_GRAPH's capture counts (null: every step runs eagerly).
  const StepGraphCache *stepGraphs() const { return graphs_.get(); }

private:
  InstrHook instrHook_;
  bool hookBlock_ = false; // inside runBlockOnce
  bool countExperts_ = false;
  ExpertTally expertTally_;
  struct Prepared;
  /// One Param/OptState/Grad from a tensor: its piece (piece = true) or the
  /// full tensor, cut like the parameter it belongs to.
  void loadValue(int v, const StTensor &t, bool piece, const std::string &where);
  void checkOutputsFinite(const Instr &in, int block, int mb, int slot) const;
  void injectNan(const Instr &in, int slot);
  void initLossScale();
  /// After the norm: unscales r.gradNorm, flags an overflow (dynamic: skip).
  void applyLossScale(StepResult &r) const;
  /// At the step's end: back off after an overflow, grow after an interval.
  void advanceLossScale(const StepResult &r);
  struct OpenRegion;
  /// One block's instrs in order (ExecutorBlock.cpp); BlockRun is its state.
  void runBlock(int block, int mb, int slot, KernelContext &ctx);
  struct BlockRun;
  // step()'s phases, in order (ExecutorStep.cpp); StepRun is the step's state.
  struct StepRun;
  void beginStepRun(StepRun &s);
  void loadBatch(StepRun &s, int mb, int slot);
  void runSchedule(StepRun &s);
  void finishGradients(StepRun &s);
  void runOptimizer(StepRun &s, int block);
  void endStepRun(StepRun &s);
  void stepMetrics(StepRun &s);
  /// Host copy of a pool value (storage may be device memory).
  std::vector<float> hostCopy(int v) const;
  double gradNormSquared() const;
  int shardIndex(const Value &v) const;
  int shardCount(const Value &v) const;
  bool tracing() const;
  /// Moves the scheduler's policy switches into the trace and the queue.
  void traceSwitches();
  int traceGroup(const CommGroup &g);
  /// An executor region (data, optimizer); `marked`: b/e are backend marks.
  void traceRegion(const char *name, int cat, int mb, uint64_t b, uint64_t e,
                   bool marked, uint64_t cpuNs = 0);
  /// A record's `cpuNs`: the thread CPU time since `cpu0` (0 unless
  /// cpuTimed_).
  uint64_t cpuSince(uint64_t cpu0) const;

  // Step graphs (ExecutorGraph.cpp; docs/cuda-graphs.md).
  std::string graphRefusal() const;
  StepGraphKey graphKey() const;
  StepGraphAction beginStepGraph(uint64_t &id, bool traced,
                                 const BatchFn &batches, StepResult &r,
                                 std::vector<float> &losses);
  /// Host buffer `which` (0 tokens, 1 targets) for microbatch mb's batch:
  /// the graph's pinned input when the step is captured or replayed.
  int32_t *graphBatch(StepGraphAction a, int mb, int which);
  void endStepGraph(StepGraphAction a, uint64_t id, bool traced);
  /// The graphs the cache let go, released with what the executor keeps
  /// for them.
  void dropEvictedGraphs();
  std::unique_ptr<StepGraphCache> graphs_; // null: every step eager
  bool graphChecked_ = false, planHasProbes_ = false;
  /// Per graph: the microbatch of each loss read its capture queued.
  std::map<uint64_t, std::vector<int>> graphLossReads_;
  /// Per graph captured in a traced step: the marked trace records the
  /// capture appended, appended again (with the step's number) at each
  /// replay, whose nodes record the marks themselves.
  std::map<uint64_t, std::vector<mapp::TraceRecord>> graphTraces_;
  size_t graphTraceFirst_ = 0; // the sink's marked records when capture began
  bool tracedGraphsOff_ = false; // a region stayed open across a capture
  std::vector<int32_t> batchHost_[2];

  const Plan &plan_;
  const Program *prog_ = nullptr;
  Program f32Program_; // prog_ with fp32 storage, when the backend needs it
  Backend &backend_;
  Communicator &comm_;
  uint8_t *pool_ = nullptr;
  uint8_t *arena_ = nullptr;
  uint64_t arenaStride_ = 0; // bytes per slot: arena_bytes rounded up to 64
  std::vector<std::vector<Prepared>> blocks_;
  std::vector<bool> blockWritesLoss_;
  int64_t step_ = 0;
  ProbeRuntime *probe_ = nullptr;
  std::vector<bool> countInNorm_; // per value: Grad counted on this rank
  /// per value: the counted element range (ZeRO-1 slice), {0, -1} = all
  std::vector<std::pair<int64_t, int64_t>> normRange_;
  double slowFactor_ = 1;
  bool timeCompute_ = false;
  uint64_t layerCpuNs_ = 0, computeCpuNs_ = 0, mbCpuNs_ = 0;
  int microbatches_ = 0; // setMicrobatches (0: the plan's)
  SchedOptions schedOptions_; // as last set, for setMicrobatches
  bool skipNonFinite_ = false, checkFinite_ = false;
  int64_t nanStep_ = -1;
  std::string lsMode_ = "none";
  LossScaleState ls_;
  double lsGrowth_ = 2, lsBackoff_ = 0.5, lsLimit_ = 0, lsMin_ = 1;
  int64_t lsInterval_ = 1000;
  std::string nanOp_;
  bool coordinator_ = true;
  mapp::MappTraceWriter *trace_ = nullptr;
  std::unique_ptr<TraceSink> sink_; // non-null iff trace_ is
  int traceEvery_ = 0, traceWindow_ = 1;
  // Host compute on one thread (CPU backend, a pool of one): compute ops
  // are timed by the thread's CPU clock too, and an injected slow compute
  // burns CPU time rather than sleeping (docs/trace-format.md "cpu").
  bool cpuTimed_ = false;
  bool planHasTrace_ = false;
  bool computeRuns_ = false;
  bool tracePaused_ = false;
  std::map<std::vector<int>, int> traceGroups_;
  std::map<std::vector<int>, int64_t> groupSeq_; // collectives issued
  std::vector<OpenRegion> open_;
  std::unique_ptr<TaskScheduler> sched_;
  bool schedPostsReceives_ = false; // adaptive: receives posted on the host
  std::vector<SchedSwitch> pendingSwitches_;
};

/// Step `r` came back non-finite (stepFinite false) with setSkipNonFinite
/// on, so the state is still the step's start: runs the step again with
/// per-op checks and throws an Error naming the first op (IR name, kernel,
/// layer) whose output went non-finite. Collective like step().
[[noreturn]] void failNonFinite(Executor &exec, const StepResult &r,
                                const Executor::BatchFn &batches);

} // namespace mapp::rt

#endif

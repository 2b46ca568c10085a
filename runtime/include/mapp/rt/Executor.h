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
#include "mapp/rt/Plan.h"
#include "mapp/rt/Safetensors.h"
#include "mapp/rt/Scheduler.h"

#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace mapp {
class MappTraceWriter;
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
};

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
  /// Blocks until every event of the steps run so far is in the writer.
  void flushTrace();
  /// Upper bound of the trace events one step records (ring sizing).
  size_t traceEventsPerStep() const;
  /// Fault injection: sleep (factor-1) x each compute instr's time.
  void setSlowCompute(double factor) { slowFactor_ = factor; }

  /// MegaDPP: the task scheduler (runtime/src/sched). The constructor
  /// installs the plan's default (adaptive for schedule "adaptive", else
  /// static); Error when the plan cannot serve `o`.
  void setScheduler(const SchedOptions &o);
  SchedStats schedStats() const { return sched_->stats(); }
  /// Policy switches since the last call (also instant events in the trace).
  std::vector<SchedSwitch> takeSchedSwitches() {
    std::vector<SchedSwitch> s;
    s.swap(pendingSwitches_);
    return s;
  }

  StepResult step(const BatchFn &batches, const GradHook &afterGrads = {});
  int64_t stepsDone() const { return step_; }

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

private:
  struct Prepared;
  struct OpenRegion;
  void runBlock(int block, int mb, int slot, KernelContext &ctx);
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
                   bool marked);

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
  mapp::MappTraceWriter *trace_ = nullptr;
  std::unique_ptr<TraceSink> sink_; // non-null iff trace_ is
  int traceEvery_ = 0, traceWindow_ = 1;
  bool planHasTrace_ = false;
  std::map<std::vector<int>, int> traceGroups_;
  std::map<std::vector<int>, int64_t> groupSeq_; // collectives issued
  std::vector<OpenRegion> open_;
  std::unique_ptr<TaskScheduler> sched_;
  std::vector<SchedSwitch> pendingSwitches_;
};

} // namespace mapp::rt

#endif

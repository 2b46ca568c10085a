//===- ExecutorStep.cpp - One training step, phase by phase ---------------===//
//
// Executor::step() as its phases, in the order they run: begin (context,
// sinks, zeroed gradients), the schedule (batches loaded, blocks run, losses
// read back), the gradients finished (hook, global norm and loss, loss
// scale), the optimizer and the step's end, the step's metrics. The blocks
// themselves run in ExecutorBlock.cpp (runBlock).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Executor.h"
#include "mapp/rt/Fbd.h"
#include "ExecutorInstr.h"
#include "TraceSink.h"
#include "mapp/trace/TraceWriter.h"

#include <cmath>
#include <limits>

using namespace mapp::rt;

/// One training step's state, passed through its phases.
struct Executor::StepRun {
  const BatchFn &batches;
  const GradHook &afterGrads;
  bool tracing = false;
  KernelContext ctx;
  StepResult r;
  std::vector<int> slotMb; // the microbatch each slot holds (-1: none)
  // Filled by readScalarAsync; valid after backend_.synchronize().
  std::vector<float> losses;
  std::vector<int> optimizerBlocks;
  bool optimizerInTable = false; // the schedule runs the optimizer itself
  bool gradsDone = false;
  /// MAPP_CUDA_GRAPH (ExecutorGraph.cpp): a replay ran everything up to
  /// finishGradients.
  StepGraphAction graph = StepGraphAction::Eager;
  uint64_t graphId = 0;

  StepRun(const BatchFn &b, const GradHook &g) : batches(b), afterGrads(g) {}
  /// The sum and count of the microbatch losses read so far.
  void localLoss(double &sum, int &n) const {
    sum = 0;
    n = 0;
    for (float l : losses)
      if (!std::isnan(l)) {
        sum += l;
        ++n;
      }
  }
};

StepResult Executor::step(const BatchFn &batches, const GradHook &afterGrads) {
  StepRun s(batches, afterGrads);
  beginStepRun(s);
  runSchedule(s);
  endStepRun(s);
  stepMetrics(s);
  ++step_;
  return s.r;
}

/// The kernels' context, the sinks, communicator and backend told of the
/// step, the gradients zeroed.
void Executor::beginStepRun(StepRun &s) {
  const Program &p = *prog_;
  KernelContext &ctx = s.ctx;
  ctx.step = step_;
  ctx.numMicrobatches = microbatches();
  ctx.maxGradNorm = plan_.maxGradNorm;
  ctx.lossScale = ls_.scale;
  ctx.pool = &backend_.pool();
  ctx.comm = &comm_;
  ctx.probe = probe_;
  ctx.backend = &backend_;
  ctx.p2pThroughHost = schedPostsReceives_;
  if (sink_)
    sink_->beginStep(step_);
  s.tracing = tracing();
  open_.clear();
  comm_.setStep(step_);
  backend_.beginStep(step_);
  s.r.step = step_;
  s.slotMb.assign(p.slots, -1);
  s.losses.assign(microbatches(),
                  std::numeric_limits<float>::quiet_NaN());
  s.graph = beginStepGraph(s.graphId, s.tracing, s.batches, s.r, s.losses);

  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].kind == ValueKind::Grad && s.graph != StepGraphAction::Replay)
      backend_.zeroStorage(valueData(static_cast<int>(v)), p.values[v].bytes);
  for (size_t b = 0; b < p.blocks.size(); ++b)
    if (p.blocks[b].kind == BlockKind::Optimizer)
      s.optimizerBlocks.push_back(static_cast<int>(b));
  sched_->beginStep(step_);
}

/// Microbatch `mb`'s tokens and targets into `slot` (a rank may hold only
/// tokens, the first stage, or only targets, the last).
void Executor::loadBatch(StepRun &s, int mb, int slot) {
  const Program &p = *prog_;
  if ((p.tokens < 0 && p.targets < 0) || !s.batches)
    return;
  const bool tr = s.tracing;
  uint64_t t0 = tr ? mapp::MappTraceWriter::nowNs() : 0;
  uint64_t cpu0 = tr && cpuTimed_ ? mapp::MappTraceWriter::threadCpuNs() : 0;
  // Filled in host memory, then copied into storage (maybe a device).
  size_t nt = static_cast<size_t>(plan_.microBatchSize) * plan_.seqLength;
  // (A captured step's copies read fixed pinned graph inputs.)
  int32_t *tok = graphBatch(s.graph, mb, 0), *tgt = graphBatch(s.graph, mb, 1);
  s.batches(step_, mb, tok, tgt);
  if (p.tokens >= 0)
    backend_.copyToStorage(valueData(p.tokens, slot), tok,
                           nt * sizeof(int32_t));
  if (p.targets >= 0)
    backend_.copyToStorage(valueData(p.targets, slot), tgt,
                           nt * sizeof(int32_t));
  s.r.tokens += static_cast<int64_t>(plan_.microBatchSize) * plan_.seqLength;
  // Host work (reading and queueing the batch): host clock.
  if (tr)
    traceRegion("data", static_cast<int>(mapp::TraceCategory::Data), mb, t0,
                mapp::MappTraceWriter::nowNs(), false, cpuSince(cpu0));
}

/// The scheduler's tasks: each microbatch's batch loaded as its slot
/// changes, the blocks run, the losses read back; an optimizer task in the
/// table finishes the gradients first.
void Executor::runSchedule(StepRun &s) {
  const Program &p = *prog_;
  Task t;
  while (sched_->next(t)) {
    if (p.blocks[t.block].kind == BlockKind::Optimizer) {
      s.optimizerInTable = true;
      finishGradients(s);
      if (!s.r.skipped)
        runOptimizer(s, t.block);
      sched_->finished(t);
      continue;
    }
    if (s.graph == StepGraphAction::Replay && !s.gradsDone) {
      sched_->finished(t);
      continue;
    }
    int slot = t.microbatch % p.slots;
    if (s.slotMb[slot] != t.microbatch) {
      s.slotMb[slot] = t.microbatch;
      loadBatch(s, t.microbatch, slot);
    }
    runBlock(t.block, t.microbatch, slot, s.ctx);
    if (blockWritesLoss_[t.block]) {
      backend_.readScalarAsync(&s.losses[t.microbatch],
                               valueData(p.loss, slot));
      if (s.graph == StepGraphAction::Capture && !s.gradsDone)
        graphLossReads_[s.graphId].push_back(t.microbatch);
    }
    sched_->finished(t);
  }
  traceSwitches();
}

/// Once per step, before the gradients are read: the hook, the global norm,
/// the loss and tokens (one world all-reduce), the loss scale's verdict.
void Executor::finishGradients(StepRun &s) {
  if (s.gradsDone)
    return;
  s.gradsDone = true;
  endStepGraph(s.graph, s.graphId, s.tracing);
  const Program &p = *prog_;
  StepResult &r = s.r;
  // The gradients are read from here on (hook, norm, optimizer; next
  // step's zeroing, saveGrads): join the asynchronous grad_syncs.
  backend_.waitComm();
  if (s.afterGrads)
    s.afterGrads(*this);
  double sq = gradNormSquared();
  backend_.synchronize(); // the losses read so far
  double lsum;
  int ln;
  s.localLoss(lsum, ln);
  r.globalTokens = r.tokens;
  if (plan_.worldSize > 1) {
    // One world all-reduce: squared norm, the loss sum and count of the
    // last stage's tp-index-0 ranks, and the tokens of the first stage's
    // tp-index-0 ranks (each dp rank's batch counted once).
    bool lossHere = p.loss >= 0 && p.tp == 0;
    // The cp ranks of a data shard read the same rows: count them once.
    bool tokHere = p.pp == 0 && p.tp == 0 && p.placement.role != "fwd" &&
                   (plan_.cp <= 1 || p.dp % plan_.cp == 0);
    double buf[4] = {sq, lossHere ? lsum : 0, lossHere ? double(ln) : 0,
                     tokHere ? double(r.tokens) : 0};
    CommGroup world = comm_.group(Group::World);
    uint64_t t0 = s.tracing ? mapp::MappTraceWriter::nowNs() : 0;
    int64_t seq = groupSeq_[world.members]++;
    comm_.allReduce(buf, 4, ReduceOp::Sum, world);
    if (s.tracing) {
      mapp::TraceRecord rec;
      rec.setName("step.metrics");
      rec.cat = mapp::TraceCategory::Comm;
      rec.op = mapp::TraceOp::AllReduce;
      rec.step = static_cast<int32_t>(step_);
      rec.group = traceGroup(world);
      rec.seq = seq;
      rec.bytes = sizeof(buf);
      rec.beginNs = t0;
      rec.endNs = mapp::MappTraceWriter::nowNs();
      sink_->appendHost(rec); // a host exchange: host clock
    }
    sq = buf[0];
    r.lossKnown = buf[2] > 0;
    r.globalLoss =
        buf[2] > 0 ? buf[1] / buf[2] : std::numeric_limits<double>::quiet_NaN();
    r.globalTokens = static_cast<int64_t>(buf[3]);
  } else {
    r.lossKnown = ln > 0;
    r.globalLoss = ln ? lsum / ln : std::numeric_limits<double>::quiet_NaN();
  }
  r.gradNorm = std::sqrt(sq);
  applyLossScale(r);
  s.ctx.gradNorm = r.gradNorm;
  r.skipped = r.skipped || (skipNonFinite_ && !stepFinite(r));
}

void Executor::runOptimizer(StepRun &s, int block) {
  uint64_t t0 = s.tracing ? sink_->mark() : 0;
  runBlock(block, 0, 0, s.ctx);
  if (s.tracing)
    traceRegion("optimizer", static_cast<int>(mapp::TraceCategory::Optimizer),
                -1, t0, sink_->mark(), true);
}

/// The gradients finished, the optimizer run (unless the schedule did or
/// the step is skipped), MegaFBD's forward ranks updated, the backend and
/// sinks flushed.
void Executor::endStepRun(StepRun &s) {
  finishGradients(s);
  if (!s.optimizerInTable && !s.r.skipped)
    for (int b : s.optimizerBlocks)
      runOptimizer(s, b);
  // MegaFBD: the forward ranks get this step's update before the next.
  if (isFbdPlan(plan_))
    syncFbdParams(*this, coordinator_);
  backend_.endStep();
  backend_.synchronize();
  if (sink_)
    sink_->endStep();
}

/// The step's local loss, expert counts (summed over dp, gathered over pp),
/// learning rate, and the loss scale's next value.
void Executor::stepMetrics(StepRun &s) {
  const Program &p = *prog_;
  StepResult &r = s.r;
  double sum;
  int n;
  s.localLoss(sum, n);
  r.loss = n ? sum / n : std::numeric_limits<double>::quiet_NaN();
  r.expertTokens = expertTally_.take();
  if (countExperts_ && plan_.dp > 1 && !isFbdPlan(plan_)) {
    // Every dp member routed its own microbatches through the same layers.
    CommGroup dp = comm_.group(Group::DP);
    ++groupSeq_[dp.members];
    ExpertTally::sumOver(r.expertTokens, comm_, dp);
  }
  if (countExperts_ && plan_.pp > 1 && !isFbdPlan(plan_)) {
    // Each stage holds other layers: the lead's line gets them all.
    CommGroup pp = comm_.group(Group::PP);
    groupSeq_[pp.members] += 2;
    ExpertTally::gatherOver(r.expertTokens, comm_, pp, comm_.rank());
  }
  r.lr = 0;
  for (int b : s.optimizerBlocks)
    for (const Instr &in : p.blocks[b].instrs)
      if ((in.kernel == "adamw" || in.kernel == "sgd") && r.lr == 0)
        r.lr = scheduledLr(in.attrs, step_);
  advanceLossScale(r);
}

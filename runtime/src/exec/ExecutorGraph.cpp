//===- ExecutorGraph.cpp - the step's forward and backward as a graph -----===//
//
// MAPP_CUDA_GRAPH=on (docs/cuda-graphs.md). The tasks of a step up to the
// gradients' use (grad zeroing, the batches' copies, every forward and
// backward block, the loss reads) are captured once per StepGraphKey and
// replayed; the gradient norm, the metrics and the optimizer stay eager
// (their scalars come from the host every step). What a capture cannot hold
// (host reads of device data, step-keyed random numbers, collectives,
// probes, host-clock trace marks) makes the executor refuse: for the whole
// program with one logged reason, or for one step (a NaN injection).
// A traced step's deferred marks (CUDA events) are graph nodes: its graph
// is keyed by the backend's mark bank, and each replay appends the trace
// records its capture appended, with the step's number.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Executor.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Fbd.h"
#include "mapp/rt/Probe.h"
#include "ExecutorInstr.h"
#include "TraceSink.h"
#include "mapp/trace/TraceWriter.h"

#include <cstdio>

using namespace mapp::rt;

namespace {

/// Perturbation kinds whose numbers are drawn from the step's counter key:
/// a replay would repeat the captured step's draw.
bool randomPerturbation(const std::string &kind) {
  return kind == "gaussian" || kind == "uniform" || kind == "bitflip";
}

} // namespace

std::string Executor::graphRefusal() const {
  if (comm_.worldSize() > 1)
    return "more than one rank (collectives and transfers are not captured "
           "yet)";
  if (plan_.schedule == "adaptive")
    return "the adaptive scheduler decides on the host between blocks";
  if (isFbdPlan(plan_))
    return "MegaFBD plans exchange parameters on the host";
  for (const Block &b : prog_->blocks)
    for (const Instr &in : b.instrs) {
      const std::string &k = in.kernel;
      // (Expert counting reads moe_assign's counts: MoE only, refused here.)
      if (k.rfind("moe_", 0) == 0)
        return "'" + k + "': MoE routing sizes the expert GEMMs on the host";
      if (k == "dropout" && in.attrs.getFloat("p", 0) != 0)
        return "dropout draws from a step-keyed counter";
      if (in.attrs.getFloat("dropout", 0) != 0)
        return "'" + k + "' has attention dropout (a step-keyed counter)";
      if (k == "perturb" && randomPerturbation(in.attrs.getStr("kind", "")))
        return "perturbation '" + in.attrs.getStr("point", in.name) +
               "' draws from a step-keyed counter";
      if (k == "constant")
        return "'constant' copies from host memory with a synchronize";
    }
  return {};
}

StepGraphKey Executor::graphKey() const {
  StepGraphKey key;
  SchedStats st = sched_->stats();
  key.schedule = st.mode + ":" + st.policy;
  key.lossScale = ls_.scale;
  for (const Block &b : prog_->blocks)
    for (const Instr &in : b.instrs)
      if (in.kernel == "perturb") {
        SwitchState s;
        s.enabled = in.attrs.getInt("enabled", 1) != 0;
        s.magnitude = in.attrs.getFloat("magnitude", 0);
        if (probe_)
          probe_->switchState(in.attrs.getInt("switch_id", 0), s);
        key.switches.push_back({s.enabled ? 1 : 0, s.magnitude});
      }
  return key;
}

StepGraphAction Executor::beginStepGraph(uint64_t &id, bool traced,
                                         const BatchFn &batches, StepResult &r,
                                         std::vector<float> &losses) {
  id = 0;
  if (!graphChecked_) {
    graphChecked_ = true;
    if (backend_.stepGraphsAsked()) {
      std::string why = backend_.stepGraphsOff();
      if (why.empty())
        why = graphRefusal();
      if (why.empty())
        graphs_ = std::make_unique<StepGraphCache>();
      else
        std::fprintf(stderr, "mapp: MAPP_CUDA_GRAPH=on: steps run eagerly: %s\n",
                     why.c_str());
    }
    for (const Block &b : prog_->blocks)
      for (const Instr &in : b.instrs)
        planHasProbes_ |= in.kernel == "probe";
  }
  // Per step: what the host must see or do between the step's kernels.
  // Trace marks can be graph nodes only when the backend defers them (the
  // host clock is read when the host passes the point).
  const int bank = traced ? backend_.traceMarkBank() : -1;
  if (!graphs_ || (traced && (bank < 0 || tracedGraphsOff_)) ||
      nanStep_ == step_ || checkFinite_ || slowFactor_ > 1 || timeCompute_ ||
      microbatches_ || instrHook_ || (probe_ && planHasProbes_))
    return StepGraphAction::Eager;
  StepGraphKey key = graphKey();
  key.traceBank = bank;
  StepGraphAction a = graphs_->next(key, id);
  dropEvictedGraphs();
  if (a == StepGraphAction::Capture) {
    graphLossReads_[id].clear();
    graphTraceFirst_ = traced ? sink_->markedInStep() : 0;
    // The pinned batch buffers the graph's copies read: allocated now, since
    // an allocation inside the capture would end it (the eager warm-up step
    // reads its batches from host vectors, not from these).
    if (prog_->tokens >= 0 || prog_->targets >= 0)
      for (int mb = 0; mb < plan_.numMicrobatches; ++mb)
        for (int which = 0; which < 2; ++which)
          graphBatch(a, mb, which);
    backend_.beginGraphCapture();
  } else if (a == StepGraphAction::Replay) {
    // The graph's copies read each microbatch's batch from its fixed
    // pinned buffers: fill them all before the launch (host work, traced
    // on the host clock as loadBatch's).
    std::vector<std::pair<uint64_t, uint64_t>> filled;
    if ((prog_->tokens >= 0 || prog_->targets >= 0) && batches)
      for (int mb = 0; mb < plan_.numMicrobatches; ++mb) {
        uint64_t t0 = traced ? mapp::MappTraceWriter::nowNs() : 0;
        batches(step_, mb, graphBatch(a, mb, 0), graphBatch(a, mb, 1));
        r.tokens += static_cast<int64_t>(plan_.microBatchSize) * plan_.seqLength;
        if (traced)
          filled.push_back({t0, mapp::MappTraceWriter::nowNs()});
      }
    std::vector<float *> dsts;
    for (int mb : graphLossReads_[id])
      dsts.push_back(&losses[mb]);
    if (!backend_.launchGraph(id, dsts)) {
      // The backend dropped its graphs (a buffer they use moved): this
      // step runs eagerly as the warm-up of its key, the next captures.
      r.tokens = 0;
      graphs_->clear();
      graphLossReads_.clear();
      graphTraces_.clear();
      graphs_->takeEvicted();
      return graphs_->next(key, id);
    }
    for (size_t mb = 0; mb < filled.size(); ++mb)
      traceRegion("data", static_cast<int>(mapp::TraceCategory::Data),
                  static_cast<int>(mb), filled[mb].first, filled[mb].second,
                  false);
    auto trace = graphTraces_.find(id);
    if (traced && trace != graphTraces_.end())
      for (mapp::TraceRecord rec : trace->second) {
        rec.step = static_cast<int32_t>(step_);
        sink_->appendMarked(rec);
      }
  }
  return a;
}

void Executor::dropEvictedGraphs() {
  for (uint64_t gone : graphs_->takeEvicted()) {
    backend_.dropGraph(gone);
    graphLossReads_.erase(gone);
    graphTraces_.erase(gone);
  }
}

int32_t *Executor::graphBatch(StepGraphAction a, int mb, int which) {
  size_t n = static_cast<size_t>(plan_.microBatchSize) * plan_.seqLength;
  if (a == StepGraphAction::Eager) {
    batchHost_[which].resize(n);
    return batchHost_[which].data();
  }
  void *p = backend_.graphInput(2 * mb + which, n * sizeof(int32_t));
  if (!p)
    fail("MAPP_CUDA_GRAPH: backend '", backend_.name(),
         "' has no pinned graph input");
  return static_cast<int32_t *>(p);
}

void Executor::endStepGraph(StepGraphAction a, uint64_t id, bool traced) {
  if (a != StepGraphAction::Capture)
    return;
  backend_.endGraphCapture(id);
  if (!traced)
    return;
  if (!open_.empty()) {
    // A region open across the graph's end would lose its begin at every
    // replay: traced steps of this run stay eager (this one ran).
    std::fprintf(stderr,
                 "mapp: MAPP_CUDA_GRAPH=on: traced steps run eagerly: trace "
                 "region '%s' stays open after the step's backward\n",
                 open_.back().begin->region.name.c_str());
    tracedGraphsOff_ = true;
    graphs_->forget(id);
    dropEvictedGraphs();
    return;
  }
  graphTraces_[id] = sink_->markedSince(graphTraceFirst_);
}

//===- RankRun.cpp - one rank of a job from its plan to its outputs -------===//
#include "DataSplit.h"
#include "RunInternal.h"

#include "mapp/rt/Backend.h"
#include "mapp/rt/Checkpoint.h"
#include "mapp/rt/Dataset.h"
#include "mapp/rt/Elastic.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Faults.h"
#include "mapp/rt/Fbd.h"
#include "mapp/rt/Generate.h"
#include "mapp/rt/LiveMonitor.h"
#include "mapp/rt/MemoryReport.h"
#include "mapp/rt/Metrics.h"
#include "mapp/rt/Patch.h"
#include "mapp/rt/ProbeSession.h"
#include "mapp/rt/Tokenizer.h"
#include "mapp/trace/TraceWriter.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <unistd.h>

namespace mapp::rt {
namespace {

std::string dumpJson(const nlohmann::json &j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// MegaDPP: each rank names its policy switches on stderr (the first 20 of
/// the run; all of them are instant events in the trace).
void reportSwitches(Executor &exec, int rank, bool quiet) {
  static std::atomic<int> shown{0};
  for (const SchedSwitch &s : exec.takeSchedSwitches()) {
    if (quiet || shown.fetch_add(1) >= 20 * exec.plan().worldSize)
      continue;
    std::fprintf(stderr,
                 "mapp-run: rank %d step %lld: scheduler %s -> %s (%s)\n", rank,
                 static_cast<long long>(s.step + 1), s.from.c_str(),
                 s.to.c_str(), s.reason.c_str());
  }
}

/// One line per rank at the end of an adaptive run or of a static pipeline
/// run (tests and bench/dpp read it); nothing for one-stage plans.
void reportScheduler(Executor &exec, int rank) {
  SchedStats st = exec.schedStats();
  if (st.mode != "adaptive" && (!st.stashBytes || exec.plan().pp == 1))
    return;
  std::fprintf(stderr,
               "mapp-run: rank %d scheduler %s: peak stash %llu bytes "
               "(cap %llu, stash %llu per chunk), %lld switches, %lld "
               "decisions, policy now %s\n",
               rank, st.mode.c_str(),
               static_cast<unsigned long long>(st.peakStashBytes),
               static_cast<unsigned long long>(st.capBytes),
               static_cast<unsigned long long>(st.stashBytes),
               static_cast<long long>(st.switches),
               static_cast<long long>(st.decisions), st.policy.c_str());
}

class RankRun {
public:
  RankRun(RunShared &sh, std::unique_ptr<Communicator> commIn)
      : sh_(sh), o_(sh.o), plan_(sh.plan),
        naming_(o_.weightsFormat, o_.saveFormat, o_.hfVocabSize) {
    commIn->setTimeout(o_.commTimeout);
    comm_ = withLinkFaults(std::move(commIn), o_.inject);
    rank_ = comm_->rank();
    lead_ = rank_ == 0;
  }

  void run() {
    createExecutor();
    if (!o_.dpSplit.empty() || o_.dpBalance) {
      split_.emplace(o_, plan_);
      exec_->setMicrobatches(split_->count(exec_->program().dp));
      if (split_->balancing())
        exec_->setTimeCompute(true);
    }
    openScope();
    if (!o_.patch.empty())
      return patch();
    if (o_.generate)
      return generateText();
    openData();
    if (!o_.weights.empty())
      exec_->loadParams(readWeights(o_, naming_, plan_), o_.weights);
    else
      exec_->initParams(o_.seed);
    openTrace();
    // MegaScan live: after the trace writer, so it is detached first.
    live_ = attachLiveMonitor(*exec_, *comm_, o_.monitor, o_.inject,
                              backendName_ == "cuda", device_, trace_.get(),
                              o_.monitorEvery, o_.monitorToDpp,
                              o_.elasticAttempt > 0, o_.monitorCost);
    // Detaches the writer (appending what the executor still holds) before
    // the writer closes, also when a step throws.
    struct DetachTrace {
      Executor &exec;
      ~DetachTrace() { exec.setTraceWriter(nullptr); }
    } detachTrace{*exec_};
    train();
    finish();
  }

private:
  /// MegaFBD: the plan's placement picks this rank's backend and device.
  void createExecutor() {
    std::string &backendName = backendName_;
    int &device = device_;
    backendName = o_.backend;
    device = comm_->deviceOrdinal();
    for (const Program &p : plan_.programs)
      if (p.rank == rank_) {
        backendName = placedBackend(p, o_.backend);
        device = placedDevice(p, device);
      }
    try {
      backend_ = createBackend(backendName, sh_.threadsPerRank, device);
    } catch (const Error &e) {
      if (!isFbdPlan(plan_))
        throw;
      fail("placement of rank ", rank_, " on ", backendName, ":", device, ": ",
           e.what());
    }
    exec_ = std::make_unique<Executor>(plan_, *backend_, *comm_);
    exec_->setCoordinator(o_.coordinator);
    if (!o_.schedule.empty() || o_.memCapBytes) {
      SchedOptions so;
      so.mode = o_.schedule;
      so.memCapBytes = o_.memCapBytes;
      exec_->setScheduler(so);
    }
  }

  /// MegaScope: probe store and live switches, when asked for (every rank
  /// reports into the same store).
  void openScope() {
    if (o_.probeDb.empty() && o_.probeControl.empty())
      return;
    ProbeSessionOptions so;
    so.db = o_.probeDb;
    so.control = o_.probeControl;
    so.controlTokenFile = o_.probeControlTokenFile;
    so.runName = o_.probeRun;
    so.plan = o_.plan;
    so.mode = o_.generate ? "generate" : "train";
    so.extraMeta = dumpJson({{"steps", o_.steps}, {"prompt", o_.prompt}});
    scope_ = std::make_unique<ProbeSession>(*exec_, so);
    if (!o_.generate && o_.patch.empty() && !o_.tokenizer.empty())
      scope_->recordVocabulary(*createTokenizer(o_.tokenizer)); // UI labels
    if (!scope_->controlEndpoint().empty() && !o_.quiet)
      std::cerr << "mapp-run: probe control at " << scope_->controlEndpoint()
                << (scope_->controlTokenFile().empty()
                        ? std::string()
                        : " (token in " + scope_->controlTokenFile() + ")")
                << "\n";
  }

  std::unique_ptr<Tokenizer> tokenizer() const {
    return createTokenizer(o_.tokenizer.empty() ? "bytes" : o_.tokenizer);
  }

  void patch() {
    PatchOptions po = parsePatchSpec(o_.patch);
    if (o_.weights.empty())
      fail("--patch needs --weights FILE (trained parameters)");
    exec_->loadParams(readSafetensors(o_.weights), o_.weights);
    PatchResult r = runPatch(*exec_, *tokenizer(), po);
    std::cout << dumpJson({{"value", r.value},
                           {"layer", po.layer},
                           {"pos", po.pos},
                           {"target", r.target},
                           {"position", r.lastA},
                           {"clean_logit", r.cleanLogit},
                           {"patched_logit", r.patchedLogit},
                           {"source_logit", r.sourceLogit},
                           {"delta", r.patchedLogit - r.cleanLogit}})
              << "\n";
    if (scope_)
      scope_->flush();
  }

  /// --generate: weights, tokenizer, then the sampling loop (Generate.h).
  void generateText() {
    if (plan_.worldSize != 1)
      fail("--generate runs single-rank plans (this plan has world_size ",
           plan_.worldSize, ")");
    if (o_.weights.empty())
      fail("--generate needs --weights FILE (trained parameters)");
    exec_->loadParams(readWeights(o_, naming_, plan_), o_.weights);
    std::unique_ptr<Tokenizer> tok = tokenizer();
    GenerateOptions g;
    g.prompt = o_.prompt;
    g.maxNewTokens = o_.maxNewTokens;
    g.temperature = o_.temperature;
    g.topK = o_.topK;
    g.greedy = o_.greedy;
    g.seed = o_.seed;
    g.kvCache = o_.kvCache;
    std::unique_ptr<std::ofstream> out;
    if (!o_.generateOut.empty()) {
      out = std::make_unique<std::ofstream>(o_.generateOut);
      if (!*out)
        fail("cannot write '", o_.generateOut, "'");
    }
    std::vector<GeneratedToken> toks =
        generate(*exec_, *tok, g, scope_.get(), out.get());
    std::vector<int32_t> ids;
    for (const GeneratedToken &t : toks)
      ids.push_back(t.token);
    if (!o_.quiet)
      std::cout << o_.prompt << tok->decode(ids) << "\n";
    if (scope_)
      scope_->flush();
  }

  /// Data: needed when this rank's program consumes tokens or targets.
  void openData() {
    const Program &prog = exec_->program();
    bool needsData = prog.tokens >= 0 || prog.targets >= 0;
    if (!needsData || o_.steps <= 0)
      return;
    if (o_.data.empty())
      fail("the plan reads tokens; give --data FILE");
    loader_ = std::make_unique<BatchLoader>(
        sh_.haveTokens ? sh_.tokens : readTokens(o_), plan_.seqLength, o_.seed,
        o_.shuffle);
    if (loader_->maxToken() >= plan_.vocabSize)
      fail("data: token id ", loader_->maxToken(),
           " is outside the plan's vocab_size ", plan_.vocabSize,
           " (wrong --tokenizer?)");
  }

  void openTrace() {
    if (o_.traceDir.empty())
      return;
    const Program &prog = exec_->program();
    mapp::TraceHeader h;
    h.rank = rank_;
    h.world = plan_.worldSize;
    h.dp = prog.dp;
    h.pp = prog.pp;
    h.tp = prog.tp;
    h.dpSize = plan_.dp;
    h.ppSize = plan_.pp;
    h.tpSize = plan_.tp;
    h.device = o_.backend == "cuda" ? "cuda:0" : o_.backend;
    h.runId = sh_.runId;
    char planHash[16];
    std::snprintf(planHash, sizeof planHash, "0x%08x", plan_.checksum);
    h.plan = planHash;
    // The ring holds two steps of events: with CUDA timestamps a step's
    // events arrive together after the step (runtime/README.md, "Tracing").
    size_t capacity = size_t(1) << 16;
    while (capacity < 2 * exec_->traceEventsPerStep() &&
           capacity < (size_t(1) << 22))
      capacity <<= 1;
    std::string err;
    trace_ = mapp::MappTraceWriter::open(o_.traceDir, h, &err, capacity);
    if (!trace_)
      fail("--trace-dir: ", err);
    exec_->setTraceWriter(trace_.get());
    if (o_.traceSampling.first >= 0)
      exec_->setTraceSampling(o_.traceSampling.first, o_.traceSampling.second);
  }

  /// Rank 0 (dp 0, pp 0, tp 0) dumps the microbatches of every dp rank: the
  /// split is a pure function of (step, dp rank, microbatch).
  Executor::BatchFn batchFn() {
    if (!loader_)
      return Executor::BatchFn();
    // The cp ranks of a dp group read the same rows (each keeps its share
    // of the sequence, docs/context-parallel.md): the data has dp/cp shards.
    const int cp = plan_.cp > 1 ? plan_.cp : 1;
    // Replica d's microbatches are places first(d)... of the step's global
    // batch: an uneven split reads the same samples as the even one.
    const int M = plan_.numMicrobatches;
    auto first = [this, M](int d) { return split_ ? split_->start(d) : d * M; };
    auto count = [this, M](int d) { return split_ ? split_->count(d) : M; };
    return [this, cp, first, count](int64_t step, int mb, int32_t *tok,
                                    int32_t *tgt) {
      const int dpRank = exec_->program().dp / cp, shards = plan_.dp / cp;
      const int64_t perStep = int64_t(shards) * plan_.numMicrobatches;
      loader_->microbatchAt(step, perStep, first(dpRank) + mb,
                            plan_.microBatchSize, tok, tgt);
      if (scope_ && mb == 0) // the UI's token axes (TokenRecord.cpp)
        scope_->recordContext(step, false, tok, plan_.seqLength);
      if (!dump_)
        return;
      dump_->write(step, mb, dpRank, plan_.microBatchSize, plan_.seqLength,
                   tok, tgt);
      size_t n = static_cast<size_t>(plan_.microBatchSize) * plan_.seqLength;
      otherTok_.resize(n);
      otherTgt_.resize(n);
      // The other replicas' microbatch mb beside this one's; with an uneven
      // split a replica may hold more: this one's last writes the rest.
      for (int d = 0; d < shards; ++d)
        for (int k = mb; d != dpRank && k < count(d) &&
                         (k == mb || mb + 1 == count(dpRank));
             ++k) {
          loader_->microbatchAt(step, perStep, first(d) + k,
                                plan_.microBatchSize, otherTok_.data(),
                                otherTgt_.data());
          dump_->write(step, k, d, plan_.microBatchSize, plan_.seqLength,
                       otherTok_.data(), otherTgt_.data());
        }
    };
  }

  void train() {
    std::unique_ptr<MetricsWriter> metrics;
    if (lead_ && !o_.metrics.empty())
      metrics = std::make_unique<MetricsWriter>(o_.metrics,
                                                o_.elasticAttempt > 0);
    if (lead_ && !o_.dumpBatches.empty())
      dump_ = std::make_unique<BatchDump>(o_.dumpBatches,
                                          o_.elasticAttempt > 0);
    Executor::BatchFn batches = batchFn();
    Executor::GradHook gradHook = [&](Executor &e) {
      if (o_.saveGrads.empty() || e.stepsDone() != 0)
        return;
      Safetensors g =
          plan_.worldSize > 1 ? e.gatherParams(true) : e.saveGrads();
      if (lead_)
        writeSafetensors(o_.saveGrads, g);
    };

    CheckpointMeta meta;
    meta.seed = o_.seed;
    meta.shuffle = o_.shuffle;
    meta.dataTokens = loader_ ? loader_->numTokens() : -1;
    meta.runId = sh_.runId;
    meta.planChecksum = plan_.checksum;
    meta.runSteps = o_.steps;
    TrainControl control(*exec_, o_.ckpt, meta);
    const int64_t first = control.start();
    if (live_)
      live_->startAt(first);
    exec_->setSkipNonFinite(true); // a non-finite step never touches the state
    // Every rank counts: the dp group sums its counts for the lead's line
    // and MegaScope's "experts" samples (the same flags on every rank).
    exec_->setCountExperts(!o_.metrics.empty() || !o_.probeDb.empty());
    exec_->setCheckFinite(o_.nanCheck);
    if (o_.nanStep >= 0)
      exec_->setInjectNan(o_.nanStep, o_.nanOp);
    Progress progress(o_.steps, lead_ && isatty(STDOUT_FILENO) != 0,
                      o_.quiet || !lead_);
    std::unique_ptr<Rebalancer> rebalance;
    if (sh_.partition >= 0) {
      rebalance = std::make_unique<Rebalancer>(sh_.partitions, sh_.partition,
                                               plan_.pp, plan_.tp, plan_.dp);
      rebalance->setHome(sh_.homePartition);
      exec_->setTimeCompute(true);
    }
    for (int64_t s = first; s < o_.steps; ++s) {
      if (scope_)
        scope_->beginStep(s);
      const bool observed = live_ && live_->observes(s);
      if (live_)
        exec_->setTracePaused(!observed);
      exec_->setSlowCompute(slowComputeFactor(o_.inject, rank_, s));
      stopIfInjected(o_.inject, rank_, s);
      crashIfInjected(o_.inject, rank_, s, sh_.processes);
      auto t0 = std::chrono::steady_clock::now();
      StepResult r = exec_->step(batches, gradHook);
      if (r.overflow) {
        if (lead_ && !o_.quiet)
          std::fprintf(stderr,
                       "mapp-run: step %lld: gradient overflow at loss scale "
                       "%g: skipped, scale now %g\n",
                       static_cast<long long>(r.step + 1), r.lossScale,
                       exec_->lossScaleState().scale);
      } else if (!stepFinite(r)) {
        failNonFinite(*exec_, r, batches);
      }
      reportSwitches(*exec_, rank_, o_.quiet);
      if (rebalance) { // every rank's compute time of the step, to all
        // [0, world): in compute instrs; [world, 2 world): in layers' ones.
        std::vector<double> t = everyRanksCompute(exec_->takeLayerCpuNs());
        const size_t w = t.size() / 2;
        rebalance->addStep({t.begin(), t.begin() + w}, {t.begin() + w, t.end()});
      }
      if (split_ && split_->balancing()) { // in place, at any step
        std::vector<DataSplit::Decision> said;
        if (split_->afterStep(r.step + 1,
                              everyRanksCompute(exec_->takeMicrobatchCpuNs()),
                              said))
          exec_->setMicrobatches(split_->count(exec_->program().dp));
        for (const DataSplit::Decision &d : said)
          if (lead_)
            reportDecision("mapp-run", o_.monitor, d.line, d.json);
      }
      if (observed)
        live_->afterStep(r.step);
      double ms = std::chrono::duration<double, std::milli>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
      StepMetrics m;
      m.step = r.step;
      m.loss = r.globalLoss;
      m.lr = r.lr;
      m.gradNorm = r.gradNorm;
      m.tokens = r.globalTokens;
      m.stepMs = ms;
      if (o_.monitorCost && s >= o_.monitorCost) // window 0: the warm-up
        (observed ? costOn_ : costOff_).push_back(ms);
      m.tokensPerS = ms > 0 ? r.globalTokens / (ms / 1000.0) : 0;
      m.lossScale = r.lossScale;
      m.skipped = r.skipped;
      m.expertTokens = std::move(r.expertTokens);
      if (scope_)
        scope_->endStep(m);
      if (lead_) {
        if (metrics)
          metrics->write(m);
        progress.update(m);
      }
      if (control.afterStep(s + 1 == o_.steps)) {
        if (lead_ && !o_.quiet)
          std::fprintf(stderr,
                       "mapp-run: stop signal: saved step %lld, exiting\n",
                       static_cast<long long>(exec_->stepsDone()));
        break;
      }
      // Re-partitioning: decided alike on every rank from the same times.
      if (rebalance && control.lastSaved() == exec_->stepsDone() &&
          s + 1 < o_.steps) {
        std::string evidence;
        int to = rebalance->decide(&evidence);
        if (lead_ && sh_.measureAfterSwitch && sh_.measuredStepMs == 0)
          sh_.measuredStepMs = rebalance->lastStepSeconds() * 1e3;
        if (to < 0 && lead_) { // the monitor alone: why this window stayed
          nlohmann::json window = {{"event", "elastic"},
                                   {"decision", "repartition-window"},
                                   {"step", exec_->stepsDone()},
                                   {"evidence", nlohmann::json::parse(evidence)}};
          reportDecision("mapp-run", o_.monitor, "", window.dump());
        }
        if (to >= 0) {
          if (lead_) {
            sh_.switchTo = to;
            sh_.switchEvidence = evidence;
          }
          break;
        }
      }
      // Elastic grow: ranks came back; this layout ends at a checkpoint.
      if (o_.stopAtSaveFrom >= 0 && control.lastSaved() == exec_->stepsDone() &&
          exec_->stepsDone() >= o_.stopAtSaveFrom && s + 1 < o_.steps) {
        if (lead_ && !o_.quiet)
          std::fprintf(stderr,
                       "mapp-run: elastic: saved step %lld, ending this layout "
                       "(ranks are back)\n",
                       static_cast<long long>(exec_->stepsDone()));
        break;
      }
    }
    progress.finish();
  }

  void finish() {
    reportScheduler(*exec_, rank_);
    if (o_.reportMemory)
      std::fprintf(stderr, "mapp-run: %s\n", memoryReport(*exec_, rank_).c_str());
    // One line even with --quiet: bench/gpu/summary.py reads it. Three
    // decimals: a cap check can turn on the hundredth (benchmarks.md).
    if (lead_ && exec_->backend().peakDeviceGiB() > 0)
      std::fprintf(stderr, "mapp-run: peak device memory %.3f GiB\n",
                   exec_->backend().peakDeviceGiB());
    if (const StepGraphCache *g = exec_->stepGraphs()) // docs/cuda-graphs.md
      std::fprintf(stderr,
                   "mapp-run: step graphs: %lld eager, %lld captured, %lld "
                   "replayed\n",
                   static_cast<long long>(g->eagerSteps()),
                   static_cast<long long>(g->captures()),
                   static_cast<long long>(g->replays()));
    if (scope_)
      scope_->flush();
    if (!o_.save.empty()) {
      Safetensors st =
          plan_.worldSize > 1 ? exec_->gatherParams() : exec_->saveParams();
      if (lead_) {
        std::string bad = firstNonFiniteTensor(st);
        if (!bad.empty())
          fail("--save: refusing to write '", o_.save,
               "': non-finite parameters: ", exec_->describeNonFinite(bad));
        writeSafetensors(o_.save, naming_.forSave(st));
      }
    }
    if (live_) {
      exec_->flushTrace();
      live_->finish();
    }
    if (lead_ && o_.monitorCost)
      reportMonitorCost();
    comm_->flush();
    exec_->setTraceWriter(nullptr);
    if (trace_)
      trace_->close();
  }

  RunShared &sh_;
  const RunOptions &o_;
  const Plan &plan_;
  CheckpointNaming naming_; // per rank: the load's HF extras reach the save
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  bool lead_ = false;
  std::string backendName_; // this rank's, after MegaFBD placement
  int device_ = 0;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<ProbeSession> scope_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<BatchDump> dump_;
  std::unique_ptr<mapp::MappTraceWriter> trace_;
  std::unique_ptr<LiveMonitor> live_;
  std::optional<DataSplit> split_; // --dp-split / --dp-balance
  std::vector<double> costOn_, costOff_; // --monitor-cost: step ms by kind

  /// This step's compute seconds of every rank, and of them the part
  /// `partNs` of this rank says (one world all-reduce): [0, world) and
  /// [world, 2 world).
  std::vector<double> everyRanksCompute(uint64_t partNs) {
    const int w = plan_.worldSize;
    std::vector<double> t(2 * w, 0.0);
    t[rank_] = exec_->takeComputeCpuNs() * 1e-9;
    t[w + rank_] = partNs * 1e-9;
    comm_->allReduce(t.data(), 2 * w, ReduceOp::Sum,
                     comm_->group(Group::World));
    return t;
  }

  /// --monitor-cost's verdict: the median step with the monitor over the
  /// median without, from the same run (windows alternate, so drift of
  /// the machine reaches both alike).
  void reportMonitorCost() const {
    if (costOn_.empty() || costOff_.empty())
      return; // a stop signal ended the run in its first windows
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      size_t n = v.size();
      return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    double on = median(costOn_), off = median(costOff_);
    std::fprintf(stderr,
                 "mapp-run: monitor cost %+.2f%%: median step %.3f ms in %zu "
                 "monitored steps, %.3f ms in %zu unmonitored (windows of %d "
                 "steps alternating in this run, the first left out)\n",
                 100 * (on / off - 1), on, costOn_.size(), off,
                 costOff_.size(), o_.monitorCost);
  }
  std::vector<int32_t> otherTok_, otherTgt_;
};

} // namespace

void runRank(RunShared &sh, std::unique_ptr<Communicator> comm) {
  RankRun(sh, std::move(comm)).run();
}

} // namespace mapp::rt

//===- StepGraphExecTest.cpp - the executor's step graphs on the CPU ------===//
//
// The executor's side of MAPP_CUDA_GRAPH (ExecutorGraph.cpp) without a GPU:
// RecordingBackend is the CPU backend with stream-capture semantics.
// Between beginGraphCapture and endGraphCapture it records every kernel
// call, copy, memset and scalar read instead of running it, with the
// arguments as they were (step, microbatch and loss scale baked in, as a
// CUDA graph bakes kernel arguments), and replays the records at each
// launch; a synchronize, a host read or a copy from memory other than a
// graph input inside a capture fails, as it does on the device. Reference:
// the same plan on the plain CPU backend, eagerly; losses, gradient norms
// and parameters must be bit-identical, and the capture counts follow the
// closed forms of StepGraphTest.cpp. With deferred trace marks (as the CUDA
// backend's events: two banks alternating by step, a captured mark a node
// that stamps its slot at each launch) a traced run must write the eager
// CPU run's events, each inside its own step's window.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "TraceFile.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/rt/Plan.h"
#include "mapp/trace/TraceWriter.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <unistd.h>

using namespace mapp::rt;
using namespace mapp::rt::test;

namespace {

class RecordingBackend final : public Backend {
public:
  // "cpu": the executor allows loss scaling on the CPU backend only.
  std::string name() const override { return "cpu"; }
  KernelFn lookup(const std::string &kernel) const override {
    return inner_->lookup(kernel) ? &RecordingBackend::trampoline : nullptr;
  }
  void *allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void release(void *p) override { inner_->release(p); }
  ThreadPool &pool() override { return inner_->pool(); }
  Tensor operandView(const Program &p, const Instr &in, int value,
                     bool isOutput, const Tensor &t) override {
    kernels_[&in.attrs] = inner_->lookup(in.kernel);
    return inner_->operandView(p, in, value, isOutput, t);
  }

  void copyToStorage(void *dst, const void *src, size_t bytes) override {
    if (!capturing_)
      return (void)std::memcpy(dst, src, bytes);
    bool input = false;
    for (auto &kv : inputs_)
      input |= src >= static_cast<const void *>(kv.second.data()) &&
               src < static_cast<const void *>(kv.second.data() + kv.second.size());
    if (!input)
      fail("capture: a copy from host memory that is not a graph input");
    record([=] { std::memcpy(dst, src, bytes); });
  }
  void zeroStorage(void *dst, size_t bytes) override {
    if (!capturing_)
      return (void)std::memset(dst, 0, bytes);
    record([=] { std::memset(dst, 0, bytes); });
  }
  void readScalarAsync(float *dst, const void *src) override {
    size_t slot = pendingDst_.size();
    pendingDst_.push_back(dst);
    if (slot >= slots_.size()) // fixed: a graph holds the slots' addresses
      fail("readScalarAsync: more than ", slots_.size(), " reads queued");
    float *s = &slots_[slot];
    if (!capturing_)
      return (void)std::memcpy(s, src, 4);
    record([=] { std::memcpy(s, src, 4); });
  }
  void copyFromStorage(void *dst, const void *src, size_t bytes) override {
    notCapturing("copyFromStorage");
    std::memcpy(dst, src, bytes);
  }
  double sumSquares(const std::vector<Tensor> &ts) override {
    notCapturing("sumSquares");
    return inner_->sumSquares(ts);
  }
  void synchronize() override {
    notCapturing("synchronize");
    for (size_t i = 0; i < pendingDst_.size(); ++i)
      *pendingDst_[i] = slots_[i];
    pendingDst_.clear();
  }

  bool stepGraphsAsked() const override { return true; }
  std::string stepGraphsOff() const override { return {}; }
  void *graphInput(int index, size_t bytes) override {
    std::vector<char> &b = inputs_[index];
    if (b.size() < bytes) {
      notCapturing("a larger pinned graph input"); // as the CUDA backend
      graphs_.clear(); // they read the old address
      b.resize(bytes);
    }
    return b.data();
  }
  void beginGraphCapture() override {
    notCapturing("beginGraphCapture");
    if (!pendingDst_.empty())
      synchronize();
    capturing_ = true;
    capture_.clear();
    captureFirstMark_ = used_[bank_];
  }
  void endGraphCapture(uint64_t id) override {
    capturing_ = false;
    graphMarks_[id] = {bank_, captureFirstMark_, used_[bank_] - captureFirstMark_};
    graphs_[id] = std::move(capture_);
    run(graphs_[id]);
  }
  bool launchGraph(uint64_t id, const std::vector<float *> &dsts) override {
    auto it = graphs_.find(id);
    if (it == graphs_.end())
      return false;
    if (!pendingDst_.empty())
      synchronize();
    auto [bank, first, n] = graphMarks_.at(id);
    if (n && (bank != bank_ || used_[bank_] != first))
      fail("launchGraph: marks of bank ", bank, " from ", first,
           " in a step of bank ", bank_, " with ", used_[bank_], " taken");
    used_[bank_] += n;
    run(it->second);
    pendingDst_ = dsts;
    ++launches_;
    return true;
  }
  void dropGraph(uint64_t id) override { graphs_.erase(id); }
  /// What the CUDA backend does when a buffer a graph points at must grow.
  void dropGraphs() { graphs_.clear(); }

  // Deferred trace marks (TraceEvents.h's model): handle = bank << 40 |
  // index; a mark stamps its slot with the host clock plus kMarkShiftNs
  // when it runs, i.e. at once or at each launch of its graph.
  static constexpr uint64_t kMarkShiftNs = uint64_t(1) << 40;
  bool deferredMarks_ = false;
  bool traceMarksDeferred() const override { return deferredMarks_; }
  void reserveTraceMarks(size_t) override { armed_ = deferredMarks_; }
  int traceMarkBank() const override { return armed_ ? bank_ : -1; }
  void beginStep(int64_t) override {
    if (!armed_)
      return;
    bank_ ^= 1;
    used_[bank_] = 0;
  }
  uint64_t traceMark() override {
    if (!deferredMarks_)
      return Backend::traceMark();
    const int b = bank_;
    const size_t i = used_[b]++;
    {
      std::lock_guard<std::mutex> lock(marksMutex_);
      if (stamps_[b].size() <= i)
        stamps_[b].resize(i + 1, 0);
    }
    auto stamp = [this, b, i] {
      std::lock_guard<std::mutex> lock(marksMutex_);
      stamps_[b][i] = mapp::MappTraceWriter::nowNs() + kMarkShiftNs;
    };
    if (capturing_)
      record(stamp);
    else
      stamp();
    return (static_cast<uint64_t>(b) << 40) | i;
  }
  void resolveTraceMarks(uint64_t *m, size_t n) override {
    std::lock_guard<std::mutex> lock(marksMutex_);
    for (size_t k = 0; k < n; ++k)
      m[k] = stamps_[m[k] >> 40].at(m[k] & ((uint64_t(1) << 40) - 1));
  }

  int64_t launches_ = 0;

private:
  using Graph = std::vector<std::function<void()>>;
  static void trampoline(const KernelArgs &a) {
    static_cast<RecordingBackend *>(a.ctx.backend)->call(a);
  }
  void call(const KernelArgs &a) {
    KernelFn fn = kernels_.at(&a.attrs);
    if (!capturing_)
      return fn(a);
    // The operand arrays live in the executor's prepared instrs; the
    // context is the step's local: copied, as a graph copies arguments.
    const Attrs *attrs = &a.attrs;
    Tensor *in = a.in, *out = a.out;
    int ni = a.numIn, no = a.numOut;
    KernelContext ctx = a.ctx;
    record([=]() mutable { fn(KernelArgs{*attrs, in, ni, out, no, ctx}); });
  }
  void record(std::function<void()> f) { capture_.push_back(std::move(f)); }
  static void run(const Graph &g) {
    for (const auto &f : g)
      f();
  }
  void notCapturing(const char *what) const {
    if (capturing_)
      fail("capture: ", what, " inside a captured step");
  }

  std::unique_ptr<Backend> inner_ = createCpuBackend(1);
  std::map<const Attrs *, KernelFn> kernels_;
  bool capturing_ = false;
  Graph capture_;
  std::map<uint64_t, Graph> graphs_;
  std::map<int, std::vector<char>> inputs_;
  std::vector<float *> pendingDst_;
  std::vector<float> slots_ = std::vector<float>(256);
  bool armed_ = false;
  int bank_ = 1; // the first step switches to bank 0
  size_t used_[2] = {0, 0};
  size_t captureFirstMark_ = 0;
  std::map<uint64_t, std::tuple<int, size_t, size_t>> graphMarks_;
  std::mutex marksMutex_; // the trace resolver reads stamps_
  std::vector<uint64_t> stamps_[2];
};

Plan parse(const PlanSpec &s) {
  std::vector<uint8_t> b = s.build();
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

/// Tokens that differ per step and microbatch, so a replay that reused a
/// captured batch would change the losses.
void batches(int64_t step, int mb, int32_t *tok, int32_t *tgt, int n, int vocab) {
  for (int i = 0; i < n; ++i) {
    int64_t k = (step * 7 + mb) * n + i;
    tok[i] = static_cast<int32_t>((k * 7 + 3) % vocab);
    tgt[i] = static_cast<int32_t>((k * 5 + 1 + step) % vocab);
  }
}

struct TrainedRun {
  std::vector<StepResult> steps;
  Safetensors params;
  const StepGraphCache *graphs = nullptr;
  int64_t launches = 0, captures = 0, eagerSteps = 0;
};

/// `steps` steps of `spec` on `backend`; keeps the executor alive in `keep`.
TrainedRun train(const PlanSpec &spec, Backend &backend, int steps,
          std::unique_ptr<Executor> &keep, Plan &plan,
          std::unique_ptr<Communicator> &comm) {
  plan = parse(spec);
  comm = createLocalComm();
  keep = std::make_unique<Executor>(plan, backend, *comm);
  keep->initParams(3);
  // As mapp-run sets it with --metrics: a plan without MoE still captures
  // (the first GPU run refused every plan for it).
  keep->setCountExperts(true);
  const int n = spec.microBatchSize * spec.seqLength, vocab = spec.vocabSize;
  TrainedRun r;
  for (int s = 0; s < steps; ++s)
    r.steps.push_back(keep->step([&](int64_t st, int mb, int32_t *t, int32_t *g) {
      batches(st, mb, t, g, n, vocab);
    }));
  r.params = keep->saveParams();
  r.graphs = keep->stepGraphs();
  return r;
}

void expectIdentical(const TrainedRun &eager, const TrainedRun &graph) {
  ASSERT_EQ(eager.steps.size(), graph.steps.size());
  for (size_t i = 0; i < eager.steps.size(); ++i) {
    // Bit for bit: the same kernels on the same data in the same order.
    EXPECT_EQ(std::memcmp(&eager.steps[i].loss, &graph.steps[i].loss, 8), 0)
        << "step " << i << ": " << eager.steps[i].loss << " vs " << graph.steps[i].loss;
    EXPECT_EQ(eager.steps[i].gradNorm, graph.steps[i].gradNorm) << "step " << i;
    EXPECT_EQ(eager.steps[i].lossScale, graph.steps[i].lossScale) << "step " << i;
    EXPECT_EQ(eager.steps[i].tokens, graph.steps[i].tokens) << "step " << i;
  }
  for (const auto &[name, t] : eager.params.tensors) {
    auto it = graph.params.tensors.find(name);
    ASSERT_NE(it, graph.params.tensors.end()) << name;
    EXPECT_EQ(t.toF32(name), it->second.toF32(name)) << name;
  }
}

MlpOptions opts() {
  MlpOptions o;
  o.optimizer = "adamw";
  o.lr = 0.01;
  o.microbatches = 3;
  o.maxGradNorm = 1.0;
  return o;
}

} // namespace

TEST(StepGraphExec, ReplayedStepsMatchTheEagerRunBitForBit) {
  const int n = 12;
  PlanSpec spec = mlpPlan(opts());
  auto cpu = createCpuBackend(1);
  RecordingBackend rec;
  std::unique_ptr<Executor> e1, e2;
  Plan p1, p2;
  std::unique_ptr<Communicator> c1, c2;
  TrainedRun eager = train(spec, *cpu, n, e1, p1, c1);
  TrainedRun graph = train(spec, rec, n, e2, p2, c2);
  EXPECT_EQ(eager.graphs, nullptr); // the CPU backend is never asked
  ASSERT_NE(graph.graphs, nullptr);
  expectIdentical(eager, graph);
  // One warm-up, one capture, n-2 replays: the closed form.
  EXPECT_EQ(graph.graphs->eagerSteps(), 1);
  EXPECT_EQ(graph.graphs->captures(), 1);
  EXPECT_EQ(graph.graphs->replays(), n - 2);
  EXPECT_EQ(rec.launches_, n - 2);
  // The losses moved: a replay that reused the captured batch or loss
  // slot would repeat the capture step's loss.
  EXPECT_NE(graph.steps[n - 1].loss, graph.steps[1].loss);
}

TEST(StepGraphExec, LossScaleChangesRecapture) {
  // Dynamic loss scaling doubling every 3 good steps: the scale is baked
  // into the dloss fill, so each value needs its own graph (a stale graph
  // would seed the backward with the old scale and the optimizer would
  // unscale by the new one).
  MlpOptions o = opts();
  o.lossScale = "dynamic";
  o.lossScaleInit = 4;
  o.lossScaleGrowthInterval = 3;
  const int n = 12;
  PlanSpec spec = mlpPlan(o);
  auto cpu = createCpuBackend(1);
  RecordingBackend rec;
  std::unique_ptr<Executor> e1, e2;
  Plan p1, p2;
  std::unique_ptr<Communicator> c1, c2;
  TrainedRun eager = train(spec, *cpu, n, e1, p1, c1);
  TrainedRun graph = train(spec, rec, n, e2, p2, c2);
  ASSERT_NE(graph.graphs, nullptr);
  ASSERT_EQ(eager.steps[3].lossScale, 8); // the scale grew at step 3
  expectIdentical(eager, graph);
  // A new scale every 3 steps: each costs E, C, R.
  EXPECT_EQ(graph.graphs->captures(), n / 3);
  EXPECT_EQ(graph.graphs->replays(), n / 3);
}

TEST(StepGraphExec, StepsTheHostMustSeeRunEagerly) {
  // --nan-check reads every op's outputs on the host: no step captured, and
  // the run still matches.
  PlanSpec spec = mlpPlan(opts());
  RecordingBackend rec;
  Plan plan = parse(spec);
  auto comm = createLocalComm();
  Executor exec(plan, rec, *comm);
  exec.initParams(3);
  exec.setCheckFinite(true);
  const int n = spec.microBatchSize * spec.seqLength;
  for (int s = 0; s < 4; ++s)
    exec.step([&](int64_t st, int mb, int32_t *t, int32_t *g) {
      batches(st, mb, t, g, n, spec.vocabSize);
    });
  ASSERT_NE(exec.stepGraphs(), nullptr);
  EXPECT_EQ(exec.stepGraphs()->captures(), 0);
  EXPECT_EQ(rec.launches_, 0);
}

TEST(StepGraphExec, DroppedGraphsFallBackToAnEagerStepAndRecapture) {
  // The backend drops its graphs after step 4 (a scratch buffer grew in
  // another key's warm-up, say): step 5's replay finds none, runs eagerly as
  // the key's warm-up, step 6 captures again: E C R R R E C R...
  PlanSpec spec = mlpPlan(opts());
  const int n = spec.microBatchSize * spec.seqLength, steps = 10;
  auto batchFn = [&](int64_t st, int mb, int32_t *t, int32_t *g) {
    batches(st, mb, t, g, n, spec.vocabSize);
  };
  auto cpu = createCpuBackend(1);
  std::unique_ptr<Executor> e1;
  Plan p1;
  std::unique_ptr<Communicator> c1;
  TrainedRun eager = train(spec, *cpu, steps, e1, p1, c1);

  RecordingBackend rec;
  Plan plan = parse(spec);
  auto comm = createLocalComm();
  Executor exec(plan, rec, *comm);
  exec.initParams(3);
  TrainedRun graph;
  for (int s = 0; s < steps; ++s) {
    if (s == 5)
      rec.dropGraphs();
    graph.steps.push_back(exec.step(batchFn));
  }
  graph.params = exec.saveParams();
  expectIdentical(eager, graph);
  EXPECT_EQ(exec.stepGraphs()->captures(), 2);
  EXPECT_EQ(rec.launches_, steps - 4); // replays at 2-4 and 7-9
}

namespace {

struct StepWindow {
  uint64_t begin, end;
};

/// `steps` traced steps of `spec` on `backend` into `dir`: the steps'
/// results in `out` (with the replay count when graphs ran), the steps'
/// host windows returned.
std::vector<StepWindow> tracedRun(const PlanSpec &spec, Backend &backend,
                                  const std::filesystem::path &dir, int steps,
                                  TrainedRun &out) {
  Plan plan = parse(spec);
  auto comm = createLocalComm();
  Executor exec(plan, backend, *comm);
  exec.initParams(3);
  auto writer = openTestTrace(dir, backend.name());
  exec.setTraceWriter(writer.get());
  const int n = spec.microBatchSize * spec.seqLength;
  std::vector<StepWindow> win;
  for (int s = 0; s < steps; ++s) {
    uint64_t b = mapp::MappTraceWriter::nowNs();
    out.steps.push_back(exec.step([&](int64_t st, int mb, int32_t *t, int32_t *g) {
      batches(st, mb, t, g, n, spec.vocabSize);
    }));
    win.push_back({b, mapp::MappTraceWriter::nowNs()});
  }
  exec.flushTrace();
  exec.setTraceWriter(nullptr);
  writer->close();
  out.params = exec.saveParams();
  if (exec.stepGraphs()) {
    out.launches = exec.stepGraphs()->replays();
    out.captures = exec.stepGraphs()->captures();
    out.eagerSteps = exec.stepGraphs()->eagerSteps();
  }
  return win;
}

/// The same traced run eagerly on the CPU backend and with step graphs on
/// RecordingBackend with deferred marks, into DIR/cpu and DIR/graph.
struct TracedPair {
  std::filesystem::path dir;
  TrainedRun eager, graph;
  std::vector<StepWindow> windows; // the graph run's steps
  std::string graphStderr;
  int64_t launches = 0; // graphs the backend launched
};

TracedPair tracedPair(const PlanSpec &spec, int steps, const std::string &name) {
  TracedPair p;
  p.dir = std::filesystem::temp_directory_path() /
          ("mapp-stepgraph-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p.dir);
  auto cpu = createCpuBackend(1);
  tracedRun(spec, *cpu, p.dir / "cpu", steps, p.eager);
  RecordingBackend rec;
  rec.deferredMarks_ = true;
  testing::internal::CaptureStderr();
  p.windows = tracedRun(spec, rec, p.dir / "graph", steps, p.graph);
  p.graphStderr = testing::internal::GetCapturedStderr();
  p.launches = rec.launches_;
  return p;
}

} // namespace

TEST(StepGraphExec, TracedStepsReplayWithTheirMarksAsGraphNodes) {
  // Every step traced, marks deferred: E, C (bank 1), C (bank 0), then
  // replays, each appending its capture's records with the step's number;
  // its marks are stamped by the replay, so every marked time lies in its
  // own step's window (a replay that re-used the captured stamps, or the
  // other bank's, would be a step or two early).
  const int steps = 7;
  TracedPair p = tracedPair(mlpPlan(opts()), steps, "trace");
  const TrainedRun &graph = p.graph;
  const std::vector<StepWindow> &win = p.windows;
  expectIdentical(p.eager, graph);
  EXPECT_EQ(graph.eagerSteps, 1);
  EXPECT_EQ(graph.captures, 2); // one per mark bank
  EXPECT_EQ(graph.launches, steps - 3);
  EXPECT_EQ(p.launches, steps - 3);

  std::vector<nlohmann::json> ce = traceEvents(p.dir / "cpu"),
                              ge = traceEvents(p.dir / "graph");
  ASSERT_FALSE(ge.empty());
  EXPECT_EQ(traceKeyCounts(ce), traceKeyCounts(ge));
  int replayedMarks = 0;
  for (const nlohmann::json &e : ge) {
    int s = e["step"];
    ASSERT_GE(s, 0);
    ASSERT_LT(s, steps);
    uint64_t b = e["b"], en = e["e"];
    uint64_t shift = e["cat"] == "data" ? 0 : RecordingBackend::kMarkShiftNs;
    EXPECT_LE(b, en) << e.dump();
    EXPECT_GE(b, win[s].begin + shift) << e.dump();
    EXPECT_LE(en, win[s].end + shift) << e.dump();
    replayedMarks += s >= 3 && shift != 0;
  }
  EXPECT_GT(replayedMarks, 0);
  std::filesystem::remove_all(p.dir);
}

TEST(StepGraphExec, RegionOpenAcrossTheGraphsEndKeepsTracedStepsEager) {
  // A trace region opened in the forward and closed in the optimizer block
  // would lose its begin at every replay: the capture at step 1 is dropped,
  // traced steps run eagerly, and the run still matches the CPU's, trace
  // included (the region in every step).
  const int steps = 5;
  PlanSpec spec = mlpPlan(opts());
  Attrs begin, end;
  begin.setInt("id", 900);
  begin.setStr("name", "span");
  begin.setStr("category", "compute");
  end.setInt("id", 900);
  for (TBlock &b : spec.blocks)
    if (b.kind == BlockKind::Forward) {
      b.instrs.insert(b.instrs.begin(), {"trace_begin", {}, {}, begin});
      break;
    }
  for (TBlock &b : spec.blocks)
    if (b.kind == BlockKind::Optimizer) {
      b.instrs.insert(b.instrs.begin(), {"trace_end", {}, {}, end});
      break;
    }
  TracedPair p = tracedPair(spec, steps, "span");
  EXPECT_NE(p.graphStderr.find("trace region 'span' stays open"), std::string::npos)
      << p.graphStderr;
  expectIdentical(p.eager, p.graph);
  EXPECT_EQ(p.graph.captures, 1); // step 1's, dropped
  EXPECT_EQ(p.launches, 0);
  std::map<TraceKey, int> cpuKeys = traceKeyCounts(traceEvents(p.dir / "cpu"));
  EXPECT_EQ(cpuKeys, traceKeyCounts(traceEvents(p.dir / "graph")));
  int spans = 0;
  for (const auto &[key, n] : cpuKeys)
    spans += std::get<1>(key) == "span" ? n : 0;
  EXPECT_EQ(spans, steps); // the optimizer closes the innermost one a step
  std::filesystem::remove_all(p.dir);
}

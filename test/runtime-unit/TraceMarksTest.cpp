//===- TraceMarksTest.cpp - the backend seam for trace timestamps ---------===//
//
// The executor takes trace times from Backend::traceMark. On the CPU backend
// a mark is the host monotonic clock, so CPU traces are what they were. A
// backend with deferred marks (the CUDA backend's events) is modelled here
// by a CPU backend whose marks are handles, resolved after the step to the
// host time taken at marking plus a known shift: the trace must then hold
// the same events as the plain CPU run, with exactly the shifted times,
// resolved only after each step's end synchronize, with back-to-back
// region boundaries sharing one mark (closed-form count), and a resolver
// failure reported as an Error.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "TraceFile.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/trace/TraceWriter.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unistd.h>

using namespace mapp::rt;
using namespace mapp::rt::test;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kShiftNs = uint64_t(1) << 40; // ~18 min: unmistakable
constexpr uint64_t kHandleTag = uint64_t(1) << 62;

/// The CPU backend with deferred marks: handle i remembers the host time
/// and step of the i-th mark.
class DeferredCpuBackend final : public Backend {
public:
  std::unique_ptr<Backend> cpu = createCpuBackend(1);
  std::mutex mutex;
  std::vector<std::pair<uint64_t, int64_t>> marks; // host ns, step
  int64_t step = -1;
  std::atomic<int64_t> syncedStep{-1}; // last step whose end sync returned
  bool ended = false;
  std::atomic<int> resolvedTooEarly{0};
  bool failResolve = false;
  size_t reserved = 0;

  std::string name() const override { return "deferred-cpu"; }
  KernelFn lookup(const std::string &k) const override { return cpu->lookup(k); }
  void *allocate(size_t n) override { return cpu->allocate(n); }
  void release(void *p) override { cpu->release(p); }
  ThreadPool &pool() override { return cpu->pool(); }
  void beginStep(int64_t s) override {
    step = s;
    ended = false;
  }
  void endStep() override { ended = true; }
  void synchronize() override {
    if (ended)
      syncedStep = step;
  }
  bool traceMarksDeferred() const override { return true; }
  void reserveTraceMarks(size_t n) override { reserved = n; }
  uint64_t traceMark() override {
    std::lock_guard<std::mutex> lock(mutex);
    marks.push_back({mapp::MappTraceWriter::nowNs(), step});
    return kHandleTag | (marks.size() - 1);
  }
  void resolveTraceMarks(uint64_t *m, size_t n) override {
    if (failResolve)
      fail("injected resolve failure");
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(m[i] & kHandleTag, kHandleTag) << "not a handle: " << m[i];
      auto [ns, s] = marks.at(m[i] & ~kHandleTag);
      if (s > syncedStep)
        ++resolvedTooEarly;
      m[i] = ns + kShiftNs;
    }
  }
  size_t markCount() {
    std::lock_guard<std::mutex> lock(mutex);
    return marks.size();
  }
};

Plan parse(const std::vector<uint8_t> &b) {
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

MlpOptions model() {
  MlpOptions o;
  o.vocab = 13;
  o.hidden = 6;
  o.ffn = 10;
  o.batch = 2;
  o.seq = 4;
  o.microbatches = 2;
  return o;
}

Executor::BatchFn batches(int vocab) {
  return [=](int64_t step, int mb, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < 8; ++i) {
      tok[i] = static_cast<int32_t>((step * 5 + mb * 3 + i) % vocab);
      tgt[i] = static_cast<int32_t>((step * 7 + mb + 2 * i) % vocab);
    }
  };
}

struct StepWindow {
  uint64_t begin, end;
};

/// Runs `steps` steps with a trace writer into `dir`; the host time window
/// of each step.
std::vector<StepWindow> runTraced(const Plan &plan, Backend &backend,
                                  const fs::path &dir, int steps) {
  std::unique_ptr<Communicator> comm = createLocalComm();
  Executor exec(plan, backend, *comm);
  exec.initParams(3);
  auto writer = openTestTrace(dir, backend.name());
  exec.setTraceWriter(writer.get());
  std::vector<StepWindow> windows;
  for (int s = 0; s < steps; ++s) {
    uint64_t b = mapp::MappTraceWriter::nowNs();
    exec.step(batches(plan.vocabSize));
    windows.push_back({b, mapp::MappTraceWriter::nowNs()});
  }
  exec.flushTrace();
  exec.setTraceWriter(nullptr);
  writer->close();
  return windows;
}

fs::path tempDir(const char *name) {
  fs::path d = fs::temp_directory_path() /
               (std::string("mapp-tracemarks-") + name + "-" +
                std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

} // namespace

TEST(TraceMarks, CpuMarksAreTheHostClock) {
  std::unique_ptr<Backend> cpu = createCpuBackend(1);
  EXPECT_FALSE(cpu->traceMarksDeferred());
  uint64_t a = mapp::MappTraceWriter::nowNs();
  uint64_t m = cpu->traceMark();
  uint64_t b = mapp::MappTraceWriter::nowNs();
  EXPECT_LE(a, m);
  EXPECT_LE(m, b);
}

TEST(TraceMarks, DeferredMarksGiveTheCpuEventsAtResolvedTimes) {
  const int steps = 3;
  Plan plan = parse(parallelMlpPlan(model(), {1, 1, 1, 1, true}).build());
  fs::path cpuDir = tempDir("cpu"), devDir = tempDir("dev");
  std::unique_ptr<Backend> cpu = createCpuBackend(1);
  runTraced(plan, *cpu, cpuDir, steps);
  DeferredCpuBackend dev;
  std::vector<StepWindow> win = runTraced(plan, dev, devDir, steps);

  // Same events (as a multiset: deferred ones reach the file after the
  // host-timed ones of their step).
  std::vector<nlohmann::json> ce = traceEvents(cpuDir), de = traceEvents(devDir);
  EXPECT_EQ(traceKeyCounts(ce), traceKeyCounts(de));
  ASSERT_FALSE(de.empty());

  // Marked times are the host times at marking plus the shift, inside their
  // step's host window; the data regions (host work) stay on the host clock.
  int marked = 0;
  for (auto &e : de) {
    uint64_t b = e["b"], en = e["e"];
    int s = e["step"];
    ASSERT_GE(s, 0);
    ASSERT_LT(s, steps);
    EXPECT_LE(b, en) << e.dump();
    uint64_t shift = e["cat"] == "data" ? 0 : kShiftNs;
    marked += shift != 0;
    EXPECT_GE(b, win[s].begin + shift) << e.dump();
    EXPECT_LE(en, win[s].end + shift) << e.dump();
  }
  EXPECT_GT(marked, 0);
  EXPECT_EQ(dev.resolvedTooEarly.load(), 0);

  // Shared boundaries: every instr of the plan is its own region, back to
  // back, so a block of R regions takes R + 1 marks; the optimizer region
  // around the optimizer block takes 2 more.
  const Program &p = plan.programs[0];
  size_t expected = 0, regionsPerStep = 0;
  auto regions = [&](int b) {
    size_t r = 0;
    for (const Instr &in : p.blocks[b].instrs)
      r += in.kernel == "trace_begin";
    return r;
  };
  // The blocks a step runs, as Executor::step orders them.
  std::vector<int> run;
  bool optimizerInTable = false;
  for (const Task &t : p.tasks) {
    run.push_back(t.block);
    optimizerInTable |= p.blocks[t.block].kind == BlockKind::Optimizer;
  }
  if (p.tasks.empty())
    for (int mb = 0; mb < plan.numMicrobatches; ++mb)
      for (size_t b = 0; b < p.blocks.size(); ++b)
        if (p.blocks[b].kind != BlockKind::Optimizer)
          run.push_back(static_cast<int>(b));
  if (!optimizerInTable)
    for (size_t b = 0; b < p.blocks.size(); ++b)
      if (p.blocks[b].kind == BlockKind::Optimizer)
        run.push_back(static_cast<int>(b));
  for (int b : run) {
    size_t r = regions(b);
    expected += r + 1 + (p.blocks[b].kind == BlockKind::Optimizer ? 2 : 0);
    regionsPerStep += r;
  }
  ASSERT_GT(regionsPerStep, 4u);
  EXPECT_EQ(dev.markCount(), expected * steps);
  EXPECT_GE(dev.reserved, expected); // the pool was sized before step 0
  fs::remove_all(cpuDir);
  fs::remove_all(devDir);
}

TEST(TraceMarks, ResolverFailureIsAnError) {
  Plan plan = parse(parallelMlpPlan(model(), {1, 1, 1, 1, true}).build());
  DeferredCpuBackend dev;
  dev.failResolve = true;
  fs::path dir = tempDir("fail");
  std::unique_ptr<Communicator> comm = createLocalComm();
  Executor exec(plan, dev, *comm);
  exec.initParams(3);
  mapp::TraceHeader h;
  std::string err;
  auto writer = mapp::MappTraceWriter::open(dir.string(), h, &err);
  ASSERT_TRUE(writer) << err;
  exec.setTraceWriter(writer.get());
  exec.step(batches(plan.vocabSize));
  try {
    exec.flushTrace();
    FAIL() << "flushTrace did not report the failure";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("injected resolve failure"),
              std::string::npos)
        << e.what();
  }
  exec.setTraceWriter(nullptr);
  writer->close();
  fs::remove_all(dir);
}

//===- CudaTraceTest.cpp - MegaScan trace times on the CUDA backend -------===//
//
// A traced MLP plan (every instr its own trace region) run on --backend=cuda
// with a trace writer; the written events must be
//   - inside their step's host time window (the resolved device times are on
//     the host monotonic clock), with e >= b;
//   - monotone and non-overlapping along the compute stream, and the
//     optimizer region must enclose the optimizer block's regions;
//   - device times, not launch times: on a GPU-bound shape the compute
//     regions of a step cover most of its wall time (launch stamps would
//     cover a few per cent);
//   - with tp = 2 (two ranks as threads on the one device, host-staged
//     all-reduces): causally consistent across ranks, i.e. each all-reduce
//     ends on every member after it began on every member;
//   - all of the one-rank checks again with MAPP_CUDA_GRAPH=on, where the
//     traced steps are replayed graphs whose marks are event record nodes
//     (a replay that did not record them again would leave times of an
//     earlier step, outside the step's window).
// `--bench` also times marking and resolving per mark on the event pool.
// Exit 77 without a GPU; 1 on any failure.
//
//===----------------------------------------------------------------------===//
#include "TestPlans.h"
#include "backend/cuda/TraceEvents.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/trace/TraceWriter.h"

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

int failures = 0;

void check(bool ok, const std::string &what) {
  if (!ok) {
    std::printf("  FAIL %s\n", what.c_str());
    ++failures;
  }
}

Plan parse(const std::vector<uint8_t> &b) {
  std::vector<uint64_t> aligned(b.size() / 8 + 1);
  std::memcpy(aligned.data(), b.data(), b.size());
  return parsePlan(reinterpret_cast<const uint8_t *>(aligned.data()), b.size());
}

Executor::BatchFn batches(int vocab, int n) {
  return [=](int64_t step, int mb, int32_t *tok, int32_t *tgt) {
    for (int i = 0; i < n; ++i) {
      tok[i] = static_cast<int32_t>((step * 131 + mb * 17 + i * 7) % vocab);
      tgt[i] = static_cast<int32_t>((step * 37 + mb * 5 + i * 3) % vocab);
    }
  };
}

struct Window {
  uint64_t begin, end;
};

/// One rank: executor on its own CUDA backend, traced into `dir`.
void runRank(const Plan &plan, std::unique_ptr<Communicator> comm,
             const fs::path &dir, int steps, std::vector<Window> &windows,
             std::string &error, int64_t *graphReplays) {
  try {
    std::unique_ptr<Backend> gpu = createCudaBackend(0);
    Executor exec(plan, *gpu, *comm);
    exec.initParams(5);
    const Program &p = exec.program();
    mapp::TraceHeader h;
    h.rank = comm->rank();
    h.world = plan.worldSize;
    h.tp = p.tp;
    h.tpSize = plan.tp;
    h.device = "cuda:0";
    std::string err;
    auto writer = mapp::MappTraceWriter::open(dir.string(), h, &err);
    if (!writer)
      fail(err);
    exec.setTraceWriter(writer.get());
    int n = plan.microBatchSize * plan.seqLength;
    for (int s = 0; s < steps; ++s) {
      uint64_t b = mapp::MappTraceWriter::nowNs();
      exec.step(batches(plan.vocabSize, n));
      windows.push_back({b, mapp::MappTraceWriter::nowNs()});
    }
    if (graphReplays)
      *graphReplays = exec.stepGraphs() ? exec.stepGraphs()->replays() : 0;
    exec.setTraceWriter(nullptr);
    writer->close();
  } catch (const std::exception &e) {
    error = e.what();
  }
}

std::vector<json> readEvents(const fs::path &file) {
  std::ifstream in(file);
  std::vector<json> ev;
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    if (j.contains("type")) {
      if (j["type"] == "footer")
        check(j["dropped"] == 0, file.string() + ": dropped events");
      continue;
    }
    ev.push_back(j);
  }
  return ev;
}

/// Regions timed on the compute stream; `data` and the metrics exchange are
/// host work on the host clock.
bool onStream(const json &e) {
  return e["cat"] != "data" && e["name"] != "step.metrics";
}

/// Per step: inside the host window, e >= b, the stream's regions in order
/// without overlap, the optimizer region around its ops. Returns per-step
/// compute coverage (Σ compute durations / step wall time).
std::vector<double> checkRank(const std::vector<json> &ev,
                              const std::vector<Window> &win,
                              const std::string &who) {
  std::map<int, std::vector<const json *>> bySteps;
  for (const json &e : ev)
    bySteps[e["step"].get<int>()].push_back(&e);
  check(bySteps.size() == win.size(), who + ": every step traced");
  std::vector<double> coverage;
  for (auto &[s, es] : bySteps) {
    if (s < 0 || s >= static_cast<int>(win.size())) {
      check(false, who + ": event of unknown step " + std::to_string(s));
      continue;
    }
    const json *optimizer = nullptr;
    std::vector<const json *> ops; // stream regions in file (= issue) order
    double compute = 0;
    for (const json *e : es) {
      uint64_t b = (*e)["b"], en = (*e)["e"];
      check(b <= en, who + ": e < b in " + e->dump());
      check(b >= win[s].begin && en <= win[s].end,
            who + ": outside its step's host window: " + e->dump());
      if (!onStream(*e))
        continue;
      if ((*e)["name"] == "optimizer")
        optimizer = e;
      else
        ops.push_back(e);
      if ((*e)["cat"] == "compute")
        compute += static_cast<double>(en - b);
    }
    check(!ops.empty() && optimizer, who + ": step has ops and an optimizer");
    for (size_t i = 1; i < ops.size(); ++i)
      check((*ops[i])["b"].get<uint64_t>() >= (*ops[i - 1])["e"].get<uint64_t>(),
            who + ": stream regions overlap or go back: " + ops[i - 1]->dump() +
                " then " + ops[i]->dump());
    if (optimizer) {
      uint64_t ob = (*optimizer)["b"], oe = (*optimizer)["e"];
      int inside = 0;
      for (const json *e : ops)
        if ((*e)["cat"] == "optimizer") {
          ++inside;
          check((*e)["b"].get<uint64_t>() >= ob && (*e)["e"].get<uint64_t>() <= oe,
                who + ": optimizer op outside the optimizer region: " + e->dump());
        }
      check(inside > 0, who + ": optimizer ops traced");
    }
    coverage.push_back(compute / static_cast<double>(win[s].end - win[s].begin));
  }
  return coverage;
}

fs::path tempDir(const char *name) {
  fs::path d = fs::temp_directory_path() /
               (std::string("mapp-cuda-trace-") + name + "-" +
                std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

/// One rank, a GPU-bound shape: ordering, nesting, host clock, coverage;
/// with `graphs`, the steps captured and replayed (MAPP_CUDA_GRAPH=on).
void singleRank(bool graphs) {
  std::printf("== one rank, GPU-bound MLP%s\n", graphs ? ", step graphs" : "");
  MlpOptions o;
  o.vocab = 8192;
  o.hidden = 1024;
  o.ffn = 4096;
  o.batch = 16; // 8192 tokens: ~1.9 TFLOP of GEMMs per microbatch
  o.seq = 512;
  o.microbatches = 2;
  Plan plan = parse(parallelMlpPlan(o, {1, 1, 1, 1, true}).build());
  fs::path dir = tempDir(graphs ? "one-graphs" : "one");
  const int steps = graphs ? 8 : 5;
  std::vector<Window> win;
  std::string err;
  int64_t replays = 0;
  if (graphs)
    setenv("MAPP_CUDA_GRAPH", "on", 1);
  runRank(plan, createLocalComm(), dir, steps, win, err, &replays);
  unsetenv("MAPP_CUDA_GRAPH");
  check(err.empty(), "run: " + err);
  // Two mark banks alternate by step: eager, capture, capture, replays.
  if (graphs)
    check(replays == steps - 3, "traced steps replayed: " +
                                    std::to_string(replays) + " of " +
                                    std::to_string(steps - 3) + " expected");
  if (!err.empty())
    return;
  std::vector<json> ev = readEvents(dir / "rank-0.trace.jsonl");
  std::vector<double> cov = checkRank(ev, win, "rank 0");
  // Step 0 pays cuBLASLt heuristics and allocations on the host.
  double best = 0;
  for (size_t s = 1; s < cov.size(); ++s)
    best = std::max(best, cov[s]);
  std::printf("  %zu events; compute coverage of step time, steps 1..: ",
              ev.size());
  for (size_t s = 1; s < cov.size(); ++s)
    std::printf("%.3f ", cov[s]);
  std::printf("\n");
  check(best >= 0.5, "compute regions cover >= 50% of a GPU-bound step "
                     "(device times, not launch times)");
  fs::remove_all(dir);
}

/// tp = 2 on one device: comm events and cross-rank causality.
void twoRanks() {
  std::printf("== tp=2, two ranks as threads on device 0\n");
  MlpOptions o;
  o.vocab = 512;
  o.hidden = 256;
  o.ffn = 512;
  o.batch = 4;
  o.seq = 64;
  o.microbatches = 2;
  Plan plan = parse(parallelMlpPlan(o, {2, 1, 1, 1, true}).build());
  fs::path dir = tempDir("tp2");
  const int steps = 3;
  std::unique_ptr<LocalWorld> world = createLocalWorld(2);
  std::vector<std::vector<Window>> win(2);
  std::vector<std::string> err(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back(runRank, std::cref(plan), world->connect(r), dir, steps,
                    std::ref(win[r]), std::ref(err[r]), nullptr);
  for (auto &t : ts)
    t.join();
  for (int r = 0; r < 2; ++r)
    check(err[r].empty(), "rank " + std::to_string(r) + ": " + err[r]);
  if (!err[0].empty() || !err[1].empty())
    return;
  std::map<std::tuple<int, int, int64_t>, std::vector<const json *>> allReduces;
  std::vector<std::vector<json>> ev(2);
  for (int r = 0; r < 2; ++r) {
    ev[r] = readEvents(dir / ("rank-" + std::to_string(r) + ".trace.jsonl"));
    checkRank(ev[r], win[r], "rank " + std::to_string(r));
  }
  for (int r = 0; r < 2; ++r)
    for (const json &e : ev[r])
      if (e.value("op", "") == "all_reduce" && e["name"] != "step.metrics")
        allReduces[{e["step"].get<int>(), r, e["seq"].get<int64_t>()}].push_back(&e);
  int pairs = 0;
  // Each collective ends on every member only after every member began it;
  // 20 µs allows for the anchor estimates of the two ranks.
  const uint64_t slack = 20000;
  for (auto &[key, es0] : allReduces) {
    auto [s, r, seq] = key;
    if (r != 0)
      continue;
    auto it = allReduces.find({s, 1, seq});
    check(it != allReduces.end(), "all-reduce matched on rank 1");
    if (it == allReduces.end())
      continue;
    const json &a = *es0[0], &b = *it->second[0];
    ++pairs;
    check(a["e"].get<uint64_t>() + slack >= b["b"].get<uint64_t>() &&
              b["e"].get<uint64_t>() + slack >= a["b"].get<uint64_t>(),
          "all-reduce intervals of the two ranks overlap: " + a.dump() + " / " +
              b.dump());
  }
  std::printf("  %zu + %zu events, %d all-reduce pairs\n", ev[0].size(),
              ev[1].size(), pairs);
  check(pairs > 0, "all-reduces traced");
  fs::remove_all(dir);
}

/// Host cost of one mark (event record) on a busy stream, and of resolving
/// one mark after the step.
void bench() {
  std::printf("== mark cost\n");
  cudaStream_t s;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    check(false, "stream");
    return;
  }
  const size_t n = 4096;
  void *buf = nullptr;
  cudaMalloc(&buf, size_t(256) << 20);
  cuda::TraceEventPool pool;
  pool.reserve(n);
  std::vector<uint64_t> marks(n);
  double recordNs = 0, resolveNs = 0;
  const int reps = 5;
  for (int rep = 0; rep < reps; ++rep) {
    pool.beginStep(s);
    // Keep the device busy so records queue behind work, as in a step.
    for (int i = 0; i < 8; ++i)
      cudaMemsetAsync(buf, i, size_t(256) << 20, s);
    uint64_t t0 = cuda::hostNowNs();
    for (size_t i = 0; i < n; ++i)
      marks[i] = pool.record(s, false);
    uint64_t t1 = cuda::hostNowNs();
    pool.endStep(s);
    cudaStreamSynchronize(s);
    pool.synchronized();
    uint64_t t2 = cuda::hostNowNs();
    pool.resolve(marks.data(), n);
    uint64_t t3 = cuda::hostNowNs();
    if (rep > 0) { // the first pays lazy driver setup
      recordNs += double(t1 - t0) / n;
      resolveNs += double(t3 - t2) / n;
    }
    for (size_t i = 1; i < n; ++i)
      if (marks[i] < marks[i - 1]) {
        check(false, "resolved marks of one stream go back");
        break;
      }
  }
  std::printf("  per mark: record %.2f us, resolve %.2f us (host); pool grew "
              "mid-step %llu times\n",
              recordNs / (reps - 1) / 1e3, resolveNs / (reps - 1) / 1e3,
              static_cast<unsigned long long>(pool.grownMidStep()));
  cudaFree(buf);
  cudaStreamDestroy(s);
}

} // namespace

int main(int argc, char **argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  bool doBench = argc > 1 && std::string(argv[1]) == "--bench";
  try {
    singleRank(false);
    singleRank(true);
    twoRanks();
    if (doBench)
      bench();
  } catch (const std::exception &e) {
    check(false, e.what());
  }
  std::printf("cuda trace test: %s (%d failure(s))\n",
              failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}

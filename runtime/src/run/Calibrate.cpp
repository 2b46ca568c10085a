//===- Calibrate.cpp - mapp-run --calibrate -------------------------------===//
//
// Every figure comes from the backend's own kernels, called as the executor
// calls them (Backend::lookup, KernelArgs), the per-instruction cost from
// the Executor itself (CalibrateExec.h): a profile prices what mapp-run
// executes, not what a hand-written loop reaches. Each measurement is the
// best (fastest) of several trials: on a shared machine the slow trials are
// other work's interference, the fastest the machine's rate.
// docs/auto-parallel.md, "Calibration", documents which figure feeds which
// profile key.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Calibrate.h"
#include "CalibrateExec.h"
#include "RankThreads.h"
#include "mapp/cost/CostModel.h"
#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RunFlags.h"
#include "mapp/rt/ThreadPool.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <sstream>
#include <sys/stat.h>
#include <thread>

using namespace mapp::rt;
using json = nlohmann::json;

namespace {

constexpr const char *kUsage =
    "mapp-run --calibrate [--backend cpu|cuda] [--threads N] "
    "[--comm local|mpi] [--calibrate-seconds S] [--quiet] -o FILE";

[[noreturn]] void usage(const std::string &msg) { throw RunUsageError(msg); }

double nowS() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int hostThreads() {
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

/// Storage from the backend (device memory under CUDA), released at the end.
class Buffers {
public:
  explicit Buffers(Backend &be) : be_(be) {}
  ~Buffers() {
    for (void *p : owned_)
      be_.release(p);
  }
  /// A tensor of `shape` holding `values`, or values in [-1, 1) when none
  /// are given (bf16: each fp32 value rounded to nearest even, as the
  /// backend rounds).
  Tensor make(Shape shape, DType dtype = DType::F32,
              std::vector<float> values = {}) {
    Tensor t;
    t.type.dtype = dtype;
    t.type.shape = std::move(shape);
    size_t n = static_cast<size_t>(t.numel());
    size_t bytes = n * dtypeSize(dtype);
    t.data = be_.allocate(std::max<size_t>(bytes, 64));
    owned_.push_back(t.data);
    std::vector<float> host = std::move(values);
    std::uniform_real_distribution<float> u(-1, 1);
    if (host.size() != n) {
      host.resize(n);
      for (float &x : host)
        x = u(rng_);
    }
    if (dtype == DType::BF16) {
      std::vector<uint16_t> half(n);
      for (size_t i = 0; i < n; ++i)
        half[i] = floatToBf16(host[i]);
      be_.copyToStorage(t.data, half.data(), bytes);
    } else {
      be_.copyToStorage(t.data, host.data(), bytes);
    }
    be_.synchronize();
    return t;
  }

private:
  Backend &be_;
  std::vector<void *> owned_;
  std::mt19937 rng_{7};
};

/// Calls one backend kernel the executor's way.
struct KernelCall {
  KernelFn fn = nullptr;
  Attrs attrs;
  std::vector<Tensor> in, out;
  KernelContext *ctx = nullptr;
  void operator()() {
    KernelArgs a{attrs, in.data(), static_cast<int>(in.size()), out.data(),
                 static_cast<int>(out.size()), *ctx};
    fn(a);
  }
};

KernelFn kernel(Backend &be, const char *name) {
  KernelFn f = be.lookup(name);
  if (!f)
    fail("--calibrate: the ", be.name(), " backend has no '", name,
         "' kernel");
  return f;
}

/// Best seconds per call of `fn` (work queued on the backend, waited for):
/// one warm-up call, then trials of enough calls to last ~20 ms each, until
/// `sliceS` is spent (at least 3 trials, at most 50).
double bestSeconds(Backend &be, const std::function<void()> &fn,
                   double sliceS) {
  double t0 = nowS();
  fn();
  be.synchronize();
  double once = std::max(nowS() - t0, 1e-7);
  int reps = static_cast<int>(std::clamp(0.02 / once, 1.0, 20000.0));
  double best = INFINITY, start = nowS();
  for (int trial = 0; trial < 50; ++trial) {
    if (trial >= 3 && nowS() - start > sliceS)
      break;
    double t = nowS();
    for (int i = 0; i < reps; ++i)
      fn();
    be.synchronize();
    best = std::min(best, (nowS() - t) / reps);
  }
  return best;
}

struct GemmClass {
  const char *name; // large | skinny | small
  int64_t m, n, k;
};

/// The shape classes: a large square product, the transformer layer's
/// tokens x hidden x 4·hidden, and small ones (launch- or call-bound; on a
/// CPU core down to the hidden sizes of the small models a CPU trains,
/// whose rate is a fraction of a large product's). Each class is a point
/// of the profile's gemm_rates, by its smallest dimension.
std::vector<GemmClass> gemmClasses(bool device) {
  if (device)
    return {{"large", 8192, 8192, 8192},
            {"skinny", 8192, 16384, 4096},
            {"small", 512, 512, 512}};
  return {{"large", 1024, 1024, 1024},
          {"skinny", 512, 2048, 512},
          {"small", 128, 128, 128},
          {"tiny", 64, 64, 64},
          {"tinier", 32, 32, 32}};
}

struct Measured {
  json gemm = json::array();
  double gemmF32 = 0, gemmBf16 = 0, gemmFp8 = 0, peakMeasured = 0;
  double memGBps = 0;
  double activationGelems = 0; // the tanh GELU kernel, elements per ns
  ExecOpOverhead op; // op_overhead_us: its slope
  json attention;
  double attentionEfficiency = 0;
  // Communicator (ranks > 1): ping-pong halves and all-reduce times, s.
  int ranks = 1;
  double pingSmallS = 0, pingLargeS = 0, allReduceSmallS = 0,
         allReduceLargeS = 0;
  double smallBytes = 0, largeBytes = 0;
  bool sharedAddressSpace = false; // the thread world's collectives
};

/// GEMM, streaming, per-op and attention figures on `be` (one rank).
void measureCompute(Backend &be, KernelContext &ctx, bool device,
                    double budgetS, Measured &m) {
  Buffers buf(be);
  // The dtypes this backend computes in: the CPU fp32 only; CUDA computes
  // bf16 (an f32 operand is converted first, as an f32 plan runs there)
  // and fp8 (the fp8_matmul kernel: bf16 operands quantized with the
  // delayed scales of its meta, then an fp8 GEMM, as an fp8 plan runs).
  std::vector<const char *> dtypes = {"f32"};
  if (device) {
    dtypes.push_back("bf16");
    dtypes.push_back("fp8");
  }
  std::vector<GemmClass> classes = gemmClasses(device);
  double gemmSlice = 0.45 * budgetS / (classes.size() * dtypes.size());
  for (std::string dt : dtypes)
    for (const GemmClass &c : classes) {
      Buffers gemmBuf(be); // freed after each class
      DType storage = dt == "f32" ? DType::F32 : DType::BF16;
      KernelCall call{kernel(be, dt == "fp8" ? "fp8_matmul" : "matmul"),
                      {}, {}, {}, &ctx};
      call.in = {gemmBuf.make({c.m, c.k}, storage),
                 gemmBuf.make({c.k, c.n}, storage)};
      call.out = {gemmBuf.make({c.m, c.n}, storage)};
      if (dt == "fp8") {
        // Meta rows (scale, amax history of 1): x, weight, gradient.
        call.in.push_back(gemmBuf.make({6}, DType::F32, {1, 0, 1, 0, 1, 0}));
        call.attrs.setStr("fp8_a", "e4m3");
        call.attrs.setStr("fp8_b", "e4m3");
        call.attrs.setInt("meta_a", 0);
        call.attrs.setInt("meta_b", 1);
      }
      double s = bestSeconds(be, call, gemmSlice);
      double tflops = 2.0 * c.m * c.n * c.k / s / 1e12;
      m.gemm.push_back({{"class", c.name},
                        {"dtype", dt},
                        {"kernel", dt == "fp8" ? "fp8_matmul" : "matmul"},
                        {"m", c.m},
                        {"n", c.n},
                        {"k", c.k},
                        {"seconds", s},
                        {"tflops", tflops}});
      if (dt != "fp8") // the peak is the widest dtype's (bf16, fp32)
        m.peakMeasured = std::max(m.peakMeasured, tflops);
      if (std::string(c.name) == "skinny")
        (dt == "f32" ? m.gemmF32 : dt == "bf16" ? m.gemmBf16 : m.gemmFp8) =
            tflops;
    }
  DType computeType = device ? DType::BF16 : DType::F32;

  // Streaming: y = a + b over tensors far beyond the caches.
  int64_t big = device ? (int64_t(1) << 28) : (int64_t(1) << 23);
  {
    KernelCall add{kernel(be, "add"), {}, {}, {}, &ctx};
    add.in = {buf.make({big}), buf.make({big})};
    add.out = {buf.make({big})};
    double s = bestSeconds(be, add, 0.1 * budgetS);
    m.memGBps = 3.0 * big * 4 / s / 1e9;
    // The activation function as the plans run it (tanh GELU; a CPU core
    // computes it far below its streaming rate).
    KernelCall gelu{kernel(be, "gelu"), {}, {}, {}, &ctx};
    gelu.attrs.setStr("approximate", "tanh");
    gelu.in = {add.in[0]};
    gelu.out = {add.out[0]};
    m.activationGelems = big / bestSeconds(be, gelu, 0.05 * budgetS) / 1e9;
  }
  // Per-op overhead: what one more instruction adds to an executor step
  // (CalibrateExec.h), not the bare kernel call.
  m.op = measureExecutorOpOverhead(be, 0.05 * budgetS);
  // Attention: causal, as the compiler emits it, FLOPs counted as the cost
  // model counts them (4·B·T²·H: scores and values, the full square).
  {
    int64_t b = device ? 4 : 1, t = device ? 2048 : 512,
            h = device ? 2048 : 512, heads = device ? 16 : 8;
    KernelCall att{kernel(be, "attention"), {}, {}, {}, &ctx};
    att.attrs.setInt("heads", heads);
    att.attrs.setFloat("scale", 1.0 / std::sqrt(double(h / heads)));
    att.attrs.setInt("causal", 1);
    att.in = {buf.make({b, t, h}, computeType), buf.make({b, t, h}, computeType),
              buf.make({b, t, h}, computeType)};
    att.out = {buf.make({b, t, h}, computeType)};
    double s = bestSeconds(be, att, 0.15 * budgetS);
    double tflops = 4.0 * b * t * t * h / s / 1e12;
    double gemmRate = computeType == DType::F32 ? m.gemmF32 : m.gemmBf16;
    m.attentionEfficiency = std::clamp(tflops / gemmRate, 1e-4, 1.0);
    m.attention = {{"b", b},         {"t", t},
                   {"h", h},         {"heads", heads},
                   {"causal", true}, {"dtype", computeType == DType::F32 ? "f32" : "bf16"},
                   {"seconds", s},   {"tflops", tflops}};
  }
}

/// One rank's part of the communicator figures (every rank calls it; rank 0
/// times): ping-pong between ranks 0 and 1 through the send/recv kernels,
/// then all-reduces over the world through the all_reduce kernel.
void measureComm(Backend &be, Communicator &comm, bool device, double budgetS,
                 Measured &m) {
  int n = comm.worldSize(), rank = comm.rank();
  Layout l;
  l.tp = n;
  comm.setLayout(l);
  CommGroup world = comm.group(Group::TP);
  double sliceS = budgetS / 2; // per message size
  KernelContext ctx;
  ctx.pool = &be.pool();
  ctx.backend = &be;
  ctx.comm = &comm;
  Buffers buf(be);
  int64_t smallN = 2, largeN = device ? (int64_t(1) << 26) : (int64_t(1) << 22);
  struct Size {
    int64_t n;
    int pingReps, reduceReps;
  };
  const Size sizes[] = {{smallN, 200, 100}, {largeN, 2, 2}};
  constexpr int kTrials = 8;
  double results[2][2] = {{INFINITY, INFINITY}, {INFINITY, INFINITY}};
  for (int si = 0; si < 2; ++si) {
    const Size &sz = sizes[si];
    Tensor t = buf.make({sz.n});
    KernelCall send{kernel(be, "send"), {}, {t}, {}, &ctx};
    KernelCall recv{kernel(be, "recv"), {}, {}, {t}, &ctx};
    int peer = rank == 0 ? 1 : 0;
    send.attrs.setInt("peer", peer);
    recv.attrs.setInt("peer", peer);
    send.attrs.setInt("tag", 7);
    recv.attrs.setInt("tag", 7);
    KernelCall reduce{kernel(be, "all_reduce"), {}, {t}, {t}, &ctx};
    reduce.attrs.setStr("group", "tp");
    reduce.attrs.setStr("reduction", "avg"); // keeps the values bounded
    double sizeStart = nowS();
    for (int trial = 0; trial <= kTrials; ++trial) { // trial 0: warm-up
      // Every rank stops at once: when any has spent the slice.
      double stop = trial >= 3 && nowS() - sizeStart > sliceS ? 1 : 0;
      comm.allReduce(&stop, 1, ReduceOp::Max, world);
      if (stop > 0)
        break;
      double t0 = nowS();
      for (int i = 0; i < sz.pingReps && rank < 2; ++i) {
        if (rank == 0) {
          send();
          recv();
        } else {
          recv();
          send();
        }
      }
      be.synchronize();
      double ping = (nowS() - t0) / sz.pingReps / 2;
      comm.barrier();
      t0 = nowS();
      for (int i = 0; i < sz.reduceReps; ++i)
        reduce();
      be.synchronize();
      double red = (nowS() - t0) / sz.reduceReps;
      if (trial > 0) {
        results[si][0] = std::min(results[si][0], ping);
        results[si][1] = std::min(results[si][1], red);
      }
    }
  }
  comm.barrier();
  if (rank != 0)
    return;
  m.ranks = n;
  m.sharedAddressSpace = comm.sharesAddressSpace();
  m.smallBytes = smallN * 4.0;
  m.largeBytes = largeN * 4.0;
  m.pingSmallS = results[0][0];
  m.pingLargeS = results[1][0];
  m.allReduceSmallS = results[0][1];
  m.allReduceLargeS = results[1][1];
}

/// Local ranks: `ranks` threads of one process, each with its own backend.
void measureLocalComm(const CalibrateOptions &o, int ranks, bool device,
                      Measured &m) {
  std::unique_ptr<LocalWorld> world = createLocalWorld(ranks);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < ranks; ++r) {
    comms.push_back(world->connect(r));
    comms.back()->setTimeout(60 + 3 * o.seconds);
  }
  RankThreadsEnd end = runOnRankThreads(*world, [&](int r) {
    // As mapp-run --comm=local: every rank thread its own backend (one CPU
    // worker; CUDA: its own stream on GPU 0).
    std::unique_ptr<Backend> be = createBackend(o.backend, 1, 0);
    measureComm(*be, *comms[r], device, 0.3 * o.seconds, m);
  });
  if (end.firstFailed >= 0)
    fail("--calibrate: the communicator measurement failed: rank ",
         end.firstFailed, ": ", end.errors[end.firstFailed]);
}

/// The device kind of `be` (the profile's `device`), and the notes on it.
std::string deviceKindOf(Backend &be, json &notes) {
  if (be.name() == "cpu")
    return "cpu";
  std::string name = be.deviceName(), upper;
  for (char c : name)
    upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const char *kind : {"H200", "H100", "A100"})
    if (upper.find(kind) != std::string::npos) {
      std::string k = kind;
      for (char &c : k)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return k;
    }
  notes.push_back("device '" + name + "' is none of the known kinds (" +
                  mapp::cost::knownDeviceKinds() +
                  "): written as h100, its measured rates stand");
  return "h100";
}

/// MemAvailable of /proc/meminfo in GiB (0 when unreadable).
double hostAvailableGiB() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:")
      return kb / (1 << 20);
  return 0;
}

/// The link a ping-pong describes: latency = the small message's one-way
/// time, bandwidth = the large message's bytes over its one-way time less
/// that latency.
mapp::cost::Link linkOf(const Measured &m) {
  mapp::cost::Link l;
  l.latencyUs = m.pingSmallS * 1e6;
  double transferS = m.pingLargeS - m.pingSmallS;
  if (transferS <= 0)
    transferS = m.pingLargeS;
  l.gbps = m.largeBytes * 8 / transferS / 1e9;
  return l;
}

/// Builds the profile from the figures; `notes` says what was not measured.
mapp::cost::Profile profileOf(Backend &be, const CalibrateOptions &o,
                              int threads, const Measured &m, json &notes,
                              json &collectiveFit) {
  using namespace mapp::cost;
  Profile p;
  std::string kind = deviceKindOf(be, notes);
  defaultProfile(kind, p);
  p.source = o.out;
  p.gemmTflopsF32 = m.gemmF32;
  p.gemmTflopsBf16 = m.gemmBf16;
  // Every class measured, by smallest dimension (the faster of two that
  // share one).
  for (const json &g : m.gemm) {
    std::string dt = g["dtype"];
    auto &list = dt == "f32" ? p.gemmRatesF32
                 : dt == "bf16" ? p.gemmRatesBf16 : p.gemmRatesFp8;
    double dim = std::min({g["m"].get<double>(), g["n"].get<double>(),
                           g["k"].get<double>()});
    double tflops = g["tflops"];
    if (!(tflops > 0) || !std::isfinite(tflops))
      continue; // a dtype the device has no GEMM for (gemm_tflops 0)
    auto at = std::lower_bound(
        list.begin(), list.end(), dim,
        [](const Profile::RatePoint &a, double d) { return a.dim < d; });
    if (at != list.end() && at->dim == dim)
      at->tflops = std::max(at->tflops, tflops);
    else
      list.insert(at, {dim, tflops});
  }
  if (kind == "cpu") {
    p.gemmTflopsFp8 = 0;
    p.peakTflops = m.peakMeasured;
    p.memoryGiB = hostAvailableGiB() > 0 ? hostAvailableGiB() : p.memoryGiB;
    // Ranks of `threads` workers each run side by side on the host's cores.
    p.sharedCores = std::max(1.0, double(hostThreads()) / threads);
    notes.push_back("peak_tflops: the fastest GEMM measured (a CPU has no "
                    "data-sheet peak here)");
    notes.push_back("memory_gib: the host's MemAvailable");
  } else {
    p.gemmTflopsFp8 = m.gemmFp8;
    notes.push_back("peak_tflops: the " + kind + " data-sheet default");
    if (m.peakMeasured > p.peakTflops) {
      p.peakTflops = m.peakMeasured;
      notes.push_back("peak_tflops raised to the fastest GEMM measured");
    }
    if (be.totalDeviceBytes() > 0)
      p.memoryGiB = double(be.totalDeviceBytes()) / (uint64_t(1) << 30);
  }
  p.bf16Storage = be.storesBf16();
  p.memGBps = m.memGBps;
  p.activationGelems = m.activationGelems;
  p.opOverheadUs = m.op.perOpS * 1e6;
  p.attentionEfficiency = m.attentionEfficiency;
  if (m.ranks < 2) {
    notes.push_back("links: the " + kind +
                    " default (one rank: no communicator to measure)");
    return p;
  }
  // Point-to-point (pipeline sends) from the ping-pong; the collectives'
  // link from the all-reduces, in the form the communicator has: the thread
  // world's members read each other's buffers between barriers (shared
  // memory: 3 syncs + 2·bytes), MPI's large all-reduces are ring-like
  // (2(n-1) steps of bytes/n). The other form's error is recorded.
  p.haveP2p = true;
  p.p2p = linkOf(m);
  p.sharedMemoryCollectives = m.sharedAddressSpace;
  int n = m.ranks;
  double syncs = m.sharedAddressSpace
                     ? Costs::sharedMemorySyncs(Costs::Coll::AllReduce)
                     : Costs::ringSteps(Costs::Coll::AllReduce, n);
  double bytesMoved = m.sharedAddressSpace ? 2 * m.largeBytes
                                           : syncs * m.largeBytes / n;
  Link coll;
  coll.latencyUs = m.allReduceSmallS / syncs * 1e6;
  double transferS = m.allReduceLargeS - m.allReduceSmallS;
  if (transferS <= 0)
    transferS = m.allReduceLargeS;
  coll.gbps = bytesMoved * 8 / transferS / 1e9;
  p.intra = coll;
  p.inter = coll;
  notes.push_back("links.inter = links.intra: measured on one host");
  notes.push_back(std::string("links.intra from the all-reduces (") +
                  (m.sharedAddressSpace ? "shared-memory" : "ring") +
                  " form), links.p2p from the ping-pong");
  // How far each form, with the fitted link, is from the measurements
  // (summed |log(predicted / measured)| over both sizes).
  auto error = [&](bool shared) {
    Profile q = p;
    q.sharedMemoryCollectives = shared;
    Costs c(q);
    double e = 0;
    for (auto [bytes, s] : {std::pair{m.smallBytes, m.allReduceSmallS},
                            std::pair{m.largeBytes, m.allReduceLargeS}}) {
      double ns = c.collectiveNs(Costs::Coll::AllReduce, bytes, n, true);
      e += std::fabs(std::log(ns / (s * 1e9)));
    }
    return e;
  };
  collectiveFit = {{"ring_log_error", error(false)},
                   {"shared_memory_log_error", error(true)}};
  return p;
}

void printTable(const json &measured, const mapp::cost::Profile &p) {
  std::ostringstream s;
  char line[160];
  s << "mapp-run --calibrate (" << measured["backend"].get<std::string>()
    << ", " << measured["threads"].get<int>() << " thread(s) per rank)\n";
  for (const json &g : measured["gemm"]) {
    std::snprintf(line, sizeof line,
                  "  gemm %-6s %-4s %6lldx%-6lldx%-6lld %10.4f TFLOP/s\n",
                  g["class"].get<std::string>().c_str(),
                  g["dtype"].get<std::string>().c_str(),
                  static_cast<long long>(g["m"].get<int64_t>()),
                  static_cast<long long>(g["n"].get<int64_t>()),
                  static_cast<long long>(g["k"].get<int64_t>()),
                  g["tflops"].get<double>());
    s << line;
  }
  std::snprintf(line, sizeof line,
                "  attention %10.4f TFLOP/s (efficiency %.3f)\n"
                "  memory    %10.2f GB/s\n  gelu      %10.4f G elements/s\n"
                "  per-op    %10.3f us\n",
                measured["attention"]["tflops"].get<double>(),
                p.attentionEfficiency, p.memGBps, p.activationGelems,
                p.opOverheadUs);
  s << line;
  if (measured.contains("comm")) {
    std::snprintf(line, sizeof line,
                  "  p2p       %10.2f Gb/s, %.2f us latency\n"
                  "  collective%10.2f Gb/s, %.2f us latency (%d ranks, %s)\n",
                  p.p2p.gbps, p.p2p.latencyUs, p.intra.gbps, p.intra.latencyUs,
                  measured["comm"]["ranks"].get<int>(),
                  p.sharedMemoryCollectives ? "shared-memory" : "ring");
    s << line;
  }
  std::cerr << s.str();
}

/// Fails before any measuring when `path` cannot take the profile.
void checkOutput(const std::string &path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    fail("-o ", path, ": is a directory (give a file name for the profile)");
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  if (dir.empty())
    dir = "/";
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail("-o ", path, ": directory '", dir, "' does not exist");
}

} // namespace

bool mapp::rt::isCalibrateCommandLine(int argc, char **argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--calibrate")
      return true;
  return false;
}

CalibrateOptions mapp::rt::parseCalibrateCommandLine(int argc, char **argv) {
  CalibrateOptions o;
  bool haveOut = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--calibrate")
      continue;
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a.rfind("-", 0) != 0)
      usage("--calibrate measures the machine and takes no plan (got '" + a +
            "'); usage: " + kUsage);
    auto [flag, value, inlineValue] = splitFlagArg(a);
    if (flag != "-o" && flag != "--out" && flag != "--backend" &&
        flag != "--comm" && flag != "--threads" &&
        flag != "--calibrate-seconds")
      usage("'" + flag + "' is not a --calibrate flag; usage: " + kUsage);
    if (!inlineValue) {
      if (i + 1 >= argc)
        usage(flag + " needs a value");
      value = argv[++i];
    }
    if (value.empty())
      usage(flag + " needs a non-empty value");
    if (flag == "-o" || flag == "--out") {
      o.out = value;
      haveOut = true;
    } else if (flag == "--backend") {
      if (value != "cpu" && value != "cuda")
        usage("--backend must be cpu or cuda, got '" + value + "'");
      o.backend = value;
    } else if (flag == "--comm") {
      if (value != "local" && value != "mpi")
        usage("--calibrate --comm must be local or mpi, got '" + value + "'");
      o.comm = value;
    } else if (flag == "--threads") {
      char *end = nullptr;
      long t = std::strtol(value.c_str(), &end, 10);
      if (*end || t < 0 || t > 1024)
        usage("--threads needs an integer in [0, 1024], got '" + value + "'");
      o.threads = static_cast<int>(t);
    } else {
      char *end = nullptr;
      double s = std::strtod(value.c_str(), &end);
      if (*end || !std::isfinite(s) || s <= 0 || s > 600)
        usage("--calibrate-seconds needs a number of seconds in (0, 600], "
              "got '" + value + "'");
      o.seconds = s;
    }
  }
  if (!haveOut)
    usage("--calibrate needs -o FILE (where the profile goes)");
  return o;
}

int mapp::rt::runCalibration(const CalibrateOptions &o) {
  checkOutput(o.out);
  bool device = o.backend == "cuda";
  double start = nowS();
  std::unique_ptr<Communicator> mpi;
  if (o.comm == "mpi") {
    mpi = createMpiComm();
    mpi->setTimeout(60 + 3 * o.seconds);
  }
  int rank = mpi ? mpi->rank() : 0;
  int ranksHere = mpi ? std::max(1, mpi->ranksOnThisHost()) : 1;
  int threads = o.threads ? o.threads : std::max(1, hostThreads() / ranksHere);
  std::unique_ptr<Backend> be =
      createBackend(o.backend, threads, mpi ? mpi->deviceOrdinal() : 0);
  Measured m;
  // Compute: rank 0 alone (the others wait), so no rank shares its cores.
  if (rank == 0) {
    KernelContext ctx;
    ctx.pool = &be->pool();
    ctx.backend = be.get();
    measureCompute(*be, ctx, device, 0.7 * o.seconds, m);
  }
  if (mpi && mpi->worldSize() > 1)
    measureComm(*be, *mpi, device, 0.3 * o.seconds, m);
  else if (!mpi)
    measureLocalComm(o, std::clamp(hostThreads(), 2, 4), device, m);
  if (rank != 0) {
    mpi.reset();
    mpiFinalize();
    return 0;
  }
  json notes = json::array(), fit;
  mapp::cost::Profile p = profileOf(*be, o, threads, m, notes, fit);
  json measured = {{"tool", "mapp-run --calibrate"},
                   {"backend", o.backend},
                   {"threads", threads},
                   {"seconds", nowS() - start},
                   {"gemm_key_class", "skinny"},
                   {"gemm", m.gemm},
                   {"attention", m.attention},
                   {"op_overhead",
                    {{"kernel", "add"},
                     {"elements", 16},
                     {"ops", {m.op.opsSmall, m.op.opsLarge}},
                     {"step_seconds", {m.op.stepSmallS, m.op.stepLargeS}}}},
                   {"notes", notes}};
  if (!device)
    measured["host_threads"] = hostThreads();
  else
    measured["device_name"] = be->deviceName();
  if (m.ranks > 1)
    measured["comm"] = {{"communicator", o.comm},
                        {"ranks", m.ranks},
                        {"small_bytes", m.smallBytes},
                        {"large_bytes", m.largeBytes},
                        {"p2p_one_way_small_s", m.pingSmallS},
                        {"p2p_one_way_large_s", m.pingLargeS},
                        {"all_reduce_small_s", m.allReduceSmallS},
                        {"all_reduce_large_s", m.allReduceLargeS},
                        {"collectives_fit", fit}};
  // profileJson's keys, the measurements beside them ("measured": the
  // parser skips it).
  json file = json::parse(mapp::cost::profileJson(p));
  file["measured"] = measured;
  std::string text = file.dump(2) + "\n";
  // Every figure must be one the parser takes back.
  mapp::cost::Profile back;
  std::string why;
  if (!mapp::cost::parseProfile(text, o.out, back, &why))
    fail("--calibrate measured an unusable profile: ", why);
  writeFileAtomic(o.out, text.data(), text.size());
  if (!o.quiet) {
    printTable(measured, p);
    std::cerr << "  wrote " << o.out << " in " << std::fixed
              << std::setprecision(1) << nowS() - start << " s\n";
  }
  if (mpi) {
    mpi.reset();
    mpiFinalize();
  }
  return 0;
}

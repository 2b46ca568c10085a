//===- CudaProbeLensTest.cpp - the device logit lens vs logitLens ---------===//
//
// The CUDA `lens` probe reduction against the double CPU reference
// (logitLens): layer and rms norm, with and without a shift, selected and
// all positions, k from 1 past the single-pass limit, fp32 and bf16 storage,
// a vocabulary that is no multiple of a tile; a position outside the
// sequence; and a timing against the host-staged path it replaced.
//
//===----------------------------------------------------------------------===//
#include "ProbeTestSupport.h"
#include "mapp/rt/ProbeReduce.h"

#include <chrono>
#include <memory>

using namespace mapp::rt;
using namespace mapp::rt::probe_test;

namespace {

struct LensCase {
  std::string name;
  Shape x; // [B,T,H]
  int64_t vocab;
  std::string norm;
  bool beta; // layer_norm's shift as a 4th input
  int64_t k;
  std::vector<int64_t> tokens; // empty: every position
};

/// n values of N(offset, scale), rounded to bf16 when stored so (the CPU
/// then reads the same values the device widens exactly).
std::vector<float> lensValues(int64_t n, float offset, float scale, bool bf16) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (float &x : v) {
    x = offset + scale * nd(rng);
    if (bf16)
      x = roundBf16(x);
  }
  return v;
}

Attrs lensAttrs(const LensCase &c, int64_t k) {
  Attrs a = probeAttrs("lens");
  a.setStr("norm", c.norm);
  a.setFloat("eps", 1e-5);
  a.setInt("k", k);
  if (!c.tokens.empty())
    a.setInts("tokens", c.tokens);
  return a;
}

/// The inputs of one lens call on the host: x, gamma, (beta), w.
struct LensInputs {
  std::vector<std::vector<float>> host;
  std::vector<Shape> shapes;
  ProbeSample reference(const Attrs &a) const {
    const std::vector<float> &w = host.back();
    return logitLens(a, host[0].data(), host[1].data(),
                     host.size() == 4 ? host[2].data() : nullptr, w.data(),
                     shapes[0], shapes.back()[0]);
  }
};

/// Smallest gap between consecutive logits among each row's k+1 most likely
/// tokens, from the double reference (log p_i - log p_i+1).
double smallestLogitGap(const ProbeSample &s) {
  int64_t rows = s.shape[0], k = s.shape[1];
  double gap = INFINITY;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i + 1 < k; ++i)
      gap = std::min(gap, std::log(double(s.data[r * k + i])) -
                              std::log(double(s.data[r * k + i + 1])));
  return gap;
}

/// Draws inputs until no two of a row's k+1 most likely logits are within
/// 1e-4 (fp32 logits are ~1e-6 off the double ones): the ranking the test
/// compares is then decided by the data, not by rounding (near-ties by
/// construction excluded). Logits have a spread of ~1.5: probabilities are
/// not all ~0 or ~1.
LensInputs drawLens(const LensCase &c, bool bf16) {
  int64_t H = c.x[2], V = c.vocab;
  for (int attempt = 0; attempt < 100; ++attempt) {
    LensInputs in;
    in.host.push_back(lensValues(numel(c.x), 0.5f, 2.0f, bf16));
    in.host.push_back(lensValues(H, 1.0f, 0.3f, bf16));
    if (c.beta)
      in.host.push_back(lensValues(H, 0.0f, 0.2f, bf16));
    in.host.push_back(lensValues(V * H, 0.0f, 1.5f / std::sqrt(float(H)), bf16));
    in.shapes = {c.x, {H}};
    if (c.beta)
      in.shapes.push_back({H});
    in.shapes.push_back({V, H});
    if (smallestLogitGap(in.reference(lensAttrs(c, std::min(c.k + 1, V)))) > 1e-4)
      return in;
  }
  fail("lens test: no inputs without near-ties for ", c.name);
}

/// Runs a lens probe on the device (`calls` times: the later calls reuse
/// the cached plan); returns its samples or throws.
std::vector<ProbeSample> deviceLens(Backend &gpu, const Attrs &a,
                                    const LensInputs &in, bool bf16,
                                    int calls = 1) {
  std::vector<Tensor> ts;
  for (size_t i = 0; i < in.host.size(); ++i)
    ts.push_back(upload(in.host[i], in.shapes[i], bf16));
  Collector gc;
  KernelContext ctx = context(&gpu, &gc);
  std::string err;
  try {
    for (int i = 0; i < calls; ++i)
      gpu.lookup("probe")({a, ts.data(), int(ts.size()), nullptr, 0, ctx});
    gpu.drainProbes();
    gpu.synchronize();
  } catch (const Error &e) {
    err = e.what();
  }
  for (Tensor &t : ts)
    cudaFree(t.data);
  if (!err.empty())
    fail(err);
  return std::move(gc.got);
}

/// Device lens vs logitLens: the same ids in the same order, probabilities
/// within 1e-5 absolute. bf16 storage gets the same tolerance: bf16 values
/// widen to fp32 exactly and the CPU reads those same values, so storage
/// adds no error; what remains is the device's fp32 norm output and fp32
/// GEMM against the double reference (~1e-7 here).
bool runLens(const LensCase &c, bool bf16, Backend &gpu, double &worst) {
  std::string err;
  double maxDiff = 0;
  try {
    LensInputs in = drawLens(c, bf16);
    Attrs a = lensAttrs(c, c.k);
    ProbeSample want = in.reference(a);
    std::vector<ProbeSample> got = deviceLens(gpu, a, in, bf16, 2);
    if (got.size() != 2)
      err = std::to_string(got.size()) + " samples, expected 2";
    for (size_t s = 0; err.empty() && s < got.size(); ++s) {
      const ProbeSample &g = got[s];
      if (g.reduction != "lens" || g.shape != want.shape || g.probeId != 5 ||
          g.step != 3 || g.microbatch != 1 || g.data.size() != want.data.size())
        err = "reduction/shape/ids of the sample differ";
      else if (g.index != want.index)
        err = "token ids differ";
      for (size_t i = 0; err.empty() && i < want.data.size(); ++i) {
        double d = std::fabs(double(g.data[i]) - want.data[i]);
        maxDiff = std::max(maxDiff, std::isnan(d) ? INFINITY : d);
        if (!(d <= 1e-5))
          err = "p[" + std::to_string(i) + "] " + std::to_string(g.data[i]) +
                " vs " + std::to_string(want.data[i]);
      }
    }
  } catch (const Error &e) {
    err = e.what();
  }
  worst = std::max(worst, maxDiff);
  char name[160];
  std::snprintf(name, sizeof name, "lens %s (max |dp| %.1e)", c.name.c_str(),
                maxDiff);
  return report(bf16 ? "bf16" : "f32", name, err);
}

std::vector<LensCase> lensCases() {
  std::vector<LensCase> cs;
  // V = 1000 + 7: no tile of the GEMM or of the row scans divides it.
  cs.push_back({"layer_norm+beta k=10 tokens 0,5,11", {2, 12, 96}, 1007,
                "layer_norm", true, 10, {0, 5, 11}});
  cs.push_back({"layer_norm no beta k=10 all 12", {2, 12, 96}, 1007,
                "layer_norm", false, 10, {}});
  cs.push_back({"rms_norm k=1 all 12", {2, 12, 96}, 1007, "rms_norm", false, 1, {}});
  cs.push_back({"rms_norm k=16 tokens 11,2", {1, 12, 96}, 1007, "rms_norm",
                false, 16, {11, 2}});
  // Above the single-pass list of 32: rounds of 32 keys.
  cs.push_back({"layer_norm+beta k=70 (3 rounds) tokens 3,7", {2, 12, 96},
                1007, "layer_norm", true, 70, {3, 7}});
  cs.push_back({"rms_norm k=33 H=300 all 20", {3, 20, 300}, 1007, "rms_norm",
                false, 33, {}});
  cs.push_back({"layer_norm+beta k=50 > V=37 (k = V)", {1, 6, 64}, 37,
                "layer_norm", true, 50, {0, 5}});
  return cs;
}

/// A position outside [0, T): the device refuses it with the CPU's message.
bool lensBadPosition(Backend &gpu) {
  std::string err;
  for (int64_t bad : {12, -1}) {
    LensCase c{"", {1, 12, 32}, 50, "rms_norm", false, 3, {0, bad}};
    LensInputs in;
    in.host = {lensValues(12 * 32, 0, 1, false), lensValues(32, 1, 0.1f, false),
               lensValues(50 * 32, 0, 0.2f, false)};
    in.shapes = {c.x, {32}, {50, 32}};
    Attrs a = lensAttrs(c, c.k);
    std::string cpuMsg, gpuMsg;
    try {
      in.reference(a);
    } catch (const Error &e) {
      cpuMsg = e.what();
    }
    try {
      deviceLens(gpu, a, in, false);
    } catch (const Error &e) {
      gpuMsg = e.what();
    }
    if (cpuMsg.empty() || gpuMsg.find(cpuMsg) == std::string::npos)
      err = "position " + std::to_string(bad) + ": device '" + gpuMsg +
            "' vs CPU '" + cpuMsg + "'";
  }
  return report("-", "lens position outside [0,T) -> CPU's error", err);
}

/// GPT-2 small's lens (H=768, V=50257, T=1024, k=10) per call: the device
/// path for 8 positions and for all 1024, and the host-staged path it
/// replaced (copy x, norm weights and the unembedding to the host, then
/// logitLens) for the 8 positions. Timings only (no check: V = 50257 rows
/// of random logits may hold near-ties).
void lensBench(Backend &gpu) {
  LensCase c{"", {1, 1024, 768}, 50257, "layer_norm", true, 10, {}};
  for (int t = 0; t < 8; ++t)
    c.tokens.push_back(127 + t * 128);
  LensInputs in;
  in.host = {lensValues(numel(c.x), 0, 1, true), lensValues(768, 1, 0.1f, false),
             lensValues(768, 0, 0.1f, false),
             lensValues(50257 * 768, 0, 0.05f, false)};
  in.shapes = {c.x, {768}, {768}, {50257, 768}};
  // The residual is stored bf16, the weights fp32 (as in training).
  std::vector<Tensor> ts;
  for (size_t i = 0; i < in.host.size(); ++i)
    ts.push_back(upload(in.host[i], in.shapes[i], i == 0));
  Collector gc;
  KernelContext ctx = context(&gpu, &gc);
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  double dev[2];
  for (int all = 0; all < 2; ++all) {
    Attrs a = lensAttrs(c, 10);
    if (all)
      a.setInts("tokens", {});
    auto call = [&] { gpu.lookup("probe")({a, ts.data(), 4, nullptr, 0, ctx}); };
    for (int i = 0; i < 3; ++i) // the plan, scratch and GEMM heuristic
      call();
    gpu.drainProbes();
    auto t0 = Clock::now();
    for (int i = 0; i < 20; ++i)
      call();
    gpu.drainProbes();
    gpu.synchronize();
    dev[all] = ms(t0, Clock::now()) / 20;
  }
  // The staged path: every input to the host (bf16 widened there), then the
  // double reference.
  Attrs a = lensAttrs(c, 10);
  auto t0 = Clock::now();
  LensInputs host;
  host.shapes = in.shapes;
  for (const Tensor &t : ts)
    host.host.push_back(download(t));
  ProbeSample s = host.reference(a);
  double staged = ms(t0, Clock::now());
  std::printf("-     lens bench GPT-2 small (H=768 V=50257 k=10): device "
              "%.3f ms/call (8 positions), %.3f ms/call (all 1024); "
              "host-staged %.1f ms/call (8 positions)\n",
              dev[0], dev[1], staged);
  for (Tensor &t : ts)
    cudaFree(t.data);
}

} // namespace

int mapp::rt::probe_test::runLensChecks(Backend &gpu, int &total) {
  int failed = 0;
  double lensWorst = 0;
  for (bool bf16 : {false, true})
    for (const LensCase &c : lensCases())
      ++total, failed += !runLens(c, bf16, gpu, lensWorst);
  ++total, failed += !lensBadPosition(gpu);
  std::printf("lens: worst |p - p_cpu| %.2e (tolerance 1e-5)\n", lensWorst);
  lensBench(gpu);
  return failed;
}

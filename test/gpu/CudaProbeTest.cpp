//===- CudaProbeTest.cpp - MegaScope on the device vs the CPU backend -----===//
//
// Every probe reduction and perturbation kind of the CUDA backend against
// the CPU backend's kernels on the same tensors, in both storage modes (f32;
// bf16, where the CPU sees the same bf16-rounded input and its output is
// rounded to bf16 as the device stores it). Reductions: statistics and
// sketches within fp32 rounding of the double CPU result, histograms, top-k
// (with ties) and raw captures exactly. Perturbations: the same elements
// perturbed with the same random numbers (bit-exact but for one-ulp double
// differences of log/cos in gaussian/uniform), live switch overrides
// included. Then the capture ring: back-pressure with a ring smaller than
// the samples of one step (every sample arrives, in order, correct), a
// clear error for a probe larger than the ring, and a bench-like set of
// probes over several steps whose slots are copied in batches (step end,
// ring wrap, back-pressure) while their plans are reused and invalidated,
// every sample against the CPU backend. The logit lens cases are in
// CudaProbeLensTest.cpp. Exit 77 without a GPU.
//
//===----------------------------------------------------------------------===//
#include "ProbeTestSupport.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/Probe.h"
#include "mapp/rt/ProbeReduce.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::probe_test;

namespace {

/// Host values around `offset`; `ties` rounds to quarters so top-k and hist
/// see equal values.
std::vector<float> randomValues(int64_t n, bool ties, bool bf16,
                                float offset = 0) {
  std::normal_distribution<float> nd(0, 1.5f);
  std::vector<float> v(n);
  for (float &x : v) {
    x = offset + nd(rng);
    if (ties)
      x = std::round(x * 4) / 4;
    if (bf16)
      x = roundBf16(x);
  }
  if (n > 7)
    v[3] = 0.f; // sparsity counts something
  return v;
}

/// Compares device samples with CPU ones; returns a description of the
/// first difference ("" = equal within tolerance).
std::string compareSamples(const std::vector<ProbeSample> &g,
                           const std::vector<ProbeSample> &c) {
  if (g.size() != c.size())
    return "sample count " + std::to_string(g.size()) + " vs " +
           std::to_string(c.size());
  for (size_t s = 0; s < c.size(); ++s) {
    const ProbeSample &a = g[s], &b = c[s];
    std::string where = b.reduction + ": ";
    if (a.reduction != b.reduction || a.shape != b.shape ||
        a.data.size() != b.data.size() || a.index != b.index ||
        a.step != b.step || a.microbatch != b.microbatch ||
        a.probeId != b.probeId)
      return where + "reduction/shape/size/index/step differ";
    if (!near(a.value, b.value, 1e-6))
      return where + std::to_string(a.value) + " vs " + std::to_string(b.value);
    bool exact = b.reduction != "sketch";
    for (size_t i = 0; i < b.data.size(); ++i)
      if (exact ? a.data[i] != b.data[i] : !near(a.data[i], b.data[i], 1e-5))
        return where + "element " + std::to_string(i) + ": " +
               std::to_string(a.data[i]) + " vs " + std::to_string(b.data[i]);
  }
  return "";
}

struct ProbeCase {
  std::string name;
  Shape shape;
  Attrs attrs;
  bool ties = false;
  float offset = 0; // a mean far from 0: the one-pass std must stay exact
};

bool runProbe(const ProbeCase &pc, bool bf16, Backend &cpu, Backend &gpu) {
  int64_t n = numel(pc.shape);
  std::vector<float> h = randomValues(n, pc.ties, bf16, pc.offset);
  Tensor ht{h.data(), {DType::F32, pc.shape}};
  Collector cc, gc;
  KernelContext cctx = context(&cpu, &cc), gctx = context(&gpu, &gc);
  cpu.lookup("probe")({pc.attrs, &ht, 1, nullptr, 0, cctx});
  Tensor dt = upload(h, pc.shape, bf16);
  std::string err;
  try {
    gpu.lookup("probe")({pc.attrs, &dt, 1, nullptr, 0, gctx});
    gpu.drainProbes();
    gpu.synchronize();
    err = compareSamples(gc.got, cc.got);
  } catch (const Error &e) {
    err = e.what();
  }
  cudaFree(dt.data);
  return report(bf16 ? "bf16" : "f32", "probe " + pc.name, err);
}

struct PerturbCase {
  std::string name;
  Attrs attrs;
  bool override = false;
  SwitchState state;
};

/// Equal bits, both NaN, or (gaussian/uniform: log/cos may differ by an ulp
/// in double) within one unit of the stored precision.
std::string comparePerturbed(const std::vector<float> &g,
                             const std::vector<float> &c, bool bf16,
                             bool drawsTranscendentals) {
  double ulp = bf16 ? 1.0 / 128 : 1.0 / (1 << 23);
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::memcmp(&g[i], &c[i], 4) == 0 || (std::isnan(g[i]) && std::isnan(c[i])))
      continue;
    if (drawsTranscendentals &&
        std::fabs(double(g[i]) - c[i]) <= ulp * std::fabs(c[i]))
      continue;
    return "element " + std::to_string(i) + ": " + std::to_string(g[i]) +
           " vs " + std::to_string(c[i]);
  }
  return "";
}

bool runPerturb(const PerturbCase &pc, bool bf16, Backend &cpu, Backend &gpu) {
  Shape shape = {2, 37, 24};
  int64_t n = numel(shape);
  std::vector<float> h = randomValues(n, false, bf16), ref(n);
  Collector rt;
  rt.hasOverride = pc.override;
  rt.override = pc.state;
  Tensor hi{h.data(), {DType::F32, shape}}, ho{ref.data(), {DType::F32, shape}};
  KernelContext cctx = context(&cpu, &rt), gctx = context(&gpu, &rt);
  cpu.lookup("perturb")({pc.attrs, &hi, 1, &ho, 1, cctx});
  if (bf16)
    for (float &x : ref)
      x = roundBf16(x);
  Tensor di = upload(h, shape, bf16), dout = upload(h, shape, bf16);
  cudaMemset(dout.data, 0xFF, n * (bf16 ? 2 : 4)); // poison
  cudaDeviceSynchronize(); // the backend's stream is non-blocking: no implicit order with this memset
  std::string err;
  try {
    gpu.lookup("perturb")({pc.attrs, &di, 1, &dout, 1, gctx});
    gpu.synchronize();
    std::string k = pc.attrs.getStr("kind", "");
    err = comparePerturbed(download(dout), ref, bf16,
                           k == "gaussian" || k == "uniform");
  } catch (const Error &e) {
    err = e.what();
  }
  cudaFree(di.data);
  cudaFree(dout.data);
  return report(bf16 ? "bf16" : "f32", "perturb " + pc.name, err);
}

std::vector<ProbeCase> probeCases() {
  std::vector<ProbeCase> cs;
  std::string all = "max,min,mean,std,absmax,sparsity";
  cs.push_back({"stats [2,70,96]", {2, 70, 96}, probeAttrs(all)});
  cs.push_back({"stats [1000003] (odd, 1-D)", {1000003}, probeAttrs(all)});
  {
    Attrs a = probeAttrs("sparsity,mean");
    a.setFloat("eps", 0.3);
    cs.push_back({"sparsity eps=0.3", {3, 50, 40}, a});
  }
  {
    Attrs a = probeAttrs("hist,mean");
    a.setInt("bins", 17);
    a.setFloat("lo", -2);
    a.setFloat("hi", 2);
    cs.push_back({"hist 17 bins [-2,2] (outside dropped)", {2, 70, 96}, a, true});
    Attrs b = probeAttrs("hist");
    b.setInt("bins", 10000);
    cs.push_back({"hist 10000 bins (global atomics)", {4, 64, 128}, b});
    Attrs c = probeAttrs("hist");
    c.setInt("bins", 3000);
    cs.push_back({"hist 3000 bins (one shared copy)", {4, 64, 128}, c});
    Attrs d = probeAttrs("mean,hist");
    d.setInt("every", 2); // step 3: nothing recorded on either backend
    cs.push_back({"every 2 at step 3 (skipped)", {2, 8, 8}, d});
  }
  {
    Attrs a = probeAttrs("topk");
    a.setInt("k", 20);
    cs.push_back({"topk 20 with ties", {2, 70, 96}, a, true});
    Attrs b = probeAttrs("topk,max");
    b.setInt("k", 7);
    b.setInts("tokens", {69});
    cs.push_back({"topk 7 of the last token", {4, 70, 1000}, b});
    // Single-pass list sizes 8/16/32 at their edges, the k-pass fallback
    // above 32, many blocks merging equal values, and k above n.
    for (int k : {1, 8, 9, 16, 17, 32, 33}) {
      Attrs c = probeAttrs("topk");
      c.setInt("k", k);
      cs.push_back({"topk " + std::to_string(k) + " of [4,70,1000] with ties",
                    {4, 70, 1000}, c, true});
    }
    Attrs d = probeAttrs("topk,mean");
    d.setInt("k", 20);
    cs.push_back({"topk 20 of 12 elements", {3, 4}, d});
  }
  {
    Attrs a = probeAttrs("std,mean,max,min,hist");
    a.setInt("bins", 64);
    a.setFloat("lo", 995);
    a.setFloat("hi", 1005);
    ProbeCase c{"stats+hist [8,128,768] around 1000 (one pass)",
                {8, 128, 768}, a};
    c.offset = 1000;
    cs.push_back(c);
    Attrs b = probeAttrs("std,hist");
    b.setInt("bins", 64);
    b.setFloat("lo", -4);
    b.setFloat("hi", 4);
    cs.push_back({"std+hist 64 bins [-4,4] (bench mlp probe)", {4, 256, 768}, b});
  }
  {
    Attrs a = probeAttrs("sketch");
    a.setInt("dim", 16);
    a.setInt("seed", 3);
    cs.push_back({"sketch dim 16 seed 3", {2, 70, 96}, a});
    Attrs b = probeAttrs("sketch,std");
    b.setInt("dim", 5);
    b.setInts("tokens", {0, 9, 33});
    cs.push_back({"sketch dim 5 of tokens 0,9,33", {3, 40, 72}, b});
    Attrs c = probeAttrs("sketch");
    c.setInt("dim", 20); // 2.5 passes of 8 outputs
    c.setInt("seed", 4);
    cs.push_back({"sketch dim 20 of 99 rows (4 rows a warp)", {3, 33, 50}, c});
  }
  {
    Attrs a = probeAttrs("raw");
    a.setInt("cap", 1000);
    cs.push_back({"raw cap 1000", {2, 70, 96}, a});
    Attrs b = probeAttrs("raw,absmax");
    b.setInts("tokens", {1, 2});
    b.setInt("cap", 100000);
    cs.push_back({"raw of tokens 1,2 (cap > selection)", {2, 70, 96}, b});
    Attrs c = probeAttrs("max,hist,topk,sketch,raw,std");
    c.setInts("tokens", {5});
    cs.push_back({"everything, token 5 of [2,10]", {2, 10}, c});
  }
  return cs;
}

std::vector<PerturbCase> perturbCases() {
  auto at = [](const char *kind, double m, double p = 0) {
    Attrs a;
    a.setInt("switch_id", 2);
    a.setStr("kind", kind);
    a.setFloat("magnitude", m);
    a.setFloat("p", p);
    a.setInt("seed", 11);
    return a;
  };
  std::vector<PerturbCase> cs;
  cs.push_back({"gaussian 0.3", at("gaussian", 0.3)});
  cs.push_back({"uniform 0.2", at("uniform", 0.2)});
  cs.push_back({"offset -0.75", at("offset", -0.75)});
  {
    Attrs a = at("mask", 0);
    a.setInts("channels", {0, 5, 23});
    cs.push_back({"mask channels 0,5,23", a});
  }
  cs.push_back({"bitflip p=0.05", at("bitflip", 0, 0.05)});
  cs.push_back({"int8 round trip", at("int8", 0)});
  cs.push_back({"fp8 e4m3 round trip", at("fp8", 0)});
  SwitchState off;
  off.enabled = false;
  cs.push_back({"gaussian switched off live", at("gaussian", 0.3), true, off});
  SwitchState retuned;
  retuned.magnitude = 2.5;
  cs.push_back({"gaussian retuned to 2.5 live", at("gaussian", 0.3), true, retuned});
  return cs;
}

/// A ring of 8 KiB and 300 calls of 4 KiB: the step waits for the worker
/// (back-pressure) yet every sample arrives in order with its values.
bool ringCases() {
  // The ring is sized from the environment when the first probe runs: the
  // variable stays set until then.
  setenv("MAPP_PROBE_RING_BYTES", "8192", 1);
  std::unique_ptr<Backend> gpu = createCudaBackend(0);
  Collector rt;
  KernelContext ctx = context(gpu.get(), &rt);
  Attrs a = probeAttrs("raw,mean");
  a.setInt("cap", 1000);
  Shape shape = {1000};
  std::vector<Tensor> ts;
  std::string err;
  try {
    for (int i = 0; i < 300; ++i) {
      ts.push_back(upload(std::vector<float>(1000, float(i)), shape, false));
      ctx.step = i;
      gpu->lookup("probe")({a, &ts.back(), 1, nullptr, 0, ctx});
      unsetenv("MAPP_PROBE_RING_BYTES");
    }
    gpu->drainProbes();
    if (rt.got.size() != 600)
      err = std::to_string(rt.got.size()) + " samples, expected 600";
    for (size_t s = 0; err.empty() && s < rt.got.size(); ++s) {
      const ProbeSample &p = rt.got[s];
      float want = float(s / 2);
      bool ok = p.step == int64_t(s / 2) &&
                (s % 2 ? p.value == want
                       : p.data.size() == 1000 && p.data[0] == want &&
                             p.data[999] == want);
      if (!ok)
        err = "sample " + std::to_string(s) + " wrong";
    }
  } catch (const Error &e) {
    err = e.what();
  }
  bool ok = report("-", "ring 8 KiB, 300 calls (back-pressure)", err);
  // A single call larger than the ring is refused with a clear message.
  std::string msg;
  try {
    Attrs big = probeAttrs("raw");
    big.setInt("cap", 4096);
    Tensor t = upload(std::vector<float>(4096, 1.f), {4096}, false);
    ts.push_back(t);
    // The ring is sized from the environment when the first probe runs.
    setenv("MAPP_PROBE_RING_BYTES", "8192", 1);
    std::unique_ptr<Backend> small = createCudaBackend(0);
    KernelContext c2 = context(small.get(), &rt);
    small->lookup("probe")({big, &t, 1, nullptr, 0, c2});
  } catch (const Error &e) {
    msg = e.what();
  }
  unsetenv("MAPP_PROBE_RING_BYTES");
  ok &= report("-", "probe larger than the ring -> Error",
               msg.find("MAPP_PROBE_RING_BYTES=8192") != std::string::npos
                   ? ""
                   : "message: '" + msg + "'");
  for (Tensor &t : ts)
    cudaFree(t.data);
  return ok;
}

/// The bench's kind of probe set (bench/gpu/scope/reduced.json, smaller):
/// 8 probes per step over 6 steps with a 32 KiB ring that one step
/// overflows, so runs of slots are copied at step ends, at ring wraps and
/// under back-pressure, with no drain in between. At step 3 one probe's
/// attrs change (k) and another's input shape: their cached plans must be
/// rebuilt. Every sample equals the CPU backend's, in call order.
bool batchCases(Backend &cpu) {
  setenv("MAPP_PROBE_RING_BYTES", "32768", 1); // read by the first probe
  std::unique_ptr<Backend> gpu = createCudaBackend(0);
  struct Probe {
    Attrs attrs;
    Shape shape;
  };
  auto make = [](int id, const std::string &reduce) {
    Attrs a = probeAttrs(reduce);
    a.setInt("probe_id", id);
    return a;
  };
  std::vector<Probe> probes;
  probes.push_back({make(0, "max,mean"), {2, 12, 64}});
  Attrs mlp = make(1, "std,hist");
  mlp.setInt("bins", 64);
  mlp.setFloat("lo", -4);
  mlp.setFloat("hi", 4);
  probes.push_back({mlp, {2, 12, 64}});
  Attrs res = make(2, "mean,absmax,sketch");
  res.setInt("dim", 16);
  res.setInt("seed", 1);
  probes.push_back({res, {2, 12, 64}});
  Attrs sk = make(3, "sketch");
  sk.setInt("seed", 1);
  probes.push_back({sk, {2, 12, 64}});
  Attrs logits = make(4, "topk");
  logits.setInt("k", 20);
  logits.setInts("tokens", {11});
  probes.push_back({logits, {2, 12, 500}});
  Attrs raw = make(5, "raw");
  raw.setInt("cap", 300);
  probes.push_back({raw, {2, 12, 64}});
  Attrs mixed = make(6, "min,sparsity,topk");
  mixed.setInt("k", 5);
  probes.push_back({mixed, {2, 12, 64}});
  Attrs wide = make(7, "hist");
  wide.setInt("bins", 3000);
  probes.push_back({wide, {2, 12, 64}});

  Collector cc, gc;
  std::vector<Tensor> live;
  std::string err;
  try {
    for (int step = 0; step < 6; ++step) {
      if (step == 3) {
        probes[4].attrs.setInt("k", 7);
        probes[0].shape = {3, 5, 64};
      }
      KernelContext cctx = context(&cpu, &cc), gctx = context(gpu.get(), &gc);
      cctx.step = gctx.step = step;
      gpu->beginStep(step);
      for (const Probe &p : probes) {
        std::vector<float> h = randomValues(numel(p.shape), step % 2, false);
        Tensor ht{h.data(), {DType::F32, p.shape}};
        cpu.lookup("probe")({p.attrs, &ht, 1, nullptr, 0, cctx});
        live.push_back(upload(h, p.shape, false));
        gpu->lookup("probe")({p.attrs, &live.back(), 1, nullptr, 0, gctx});
        unsetenv("MAPP_PROBE_RING_BYTES");
      }
      if (step % 2 == 0)
        gpu->endStep(); // odd steps: copied by a wrap, back-pressure or drain
    }
    gpu->drainProbes();
    err = compareSamples(gc.got, cc.got);
  } catch (const Error &e) {
    err = e.what();
  }
  // The ring really was 32 KiB (so the steps above wrapped it): a 36 KB
  // call is refused.
  if (err.empty()) {
    Attrs big = make(8, "raw");
    big.setInt("cap", 9000);
    live.push_back(upload(std::vector<float>(9000, 1.f), {9000}, false));
    KernelContext ctx = context(gpu.get(), &gc);
    try {
      gpu->lookup("probe")({big, &live.back(), 1, nullptr, 0, ctx});
      err = "a 36 KB probe call passed a 32 KiB ring";
    } catch (const Error &e) {
      if (std::string(e.what()).find("MAPP_PROBE_RING_BYTES=32768") ==
          std::string::npos)
        err = std::string("ring size: ") + e.what();
    }
  }
  for (Tensor &t : live)
    cudaFree(t.data);
  return report("-", "8 probes x 6 steps, 32 KiB ring (batched copies)", err);
}

} // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  std::unique_ptr<Backend> cpu = createCpuBackend(4);
  std::unique_ptr<Backend> gpu = createCudaBackend(0);
  int failed = 0, total = 0;
  for (bool bf16 : {false, true}) {
    for (const ProbeCase &c : probeCases())
      ++total, failed += !runProbe(c, bf16, *cpu, *gpu);
    for (const PerturbCase &c : perturbCases())
      ++total, failed += !runPerturb(c, bf16, *cpu, *gpu);
  }
  failed += runLensChecks(*gpu, total);
  total += 3;
  failed += ringCases() ? 0 : 2;
  failed += batchCases(*cpu) ? 0 : 1;
  std::printf("cuda probe check: %d/%d passed\n", total - failed, total);
  return failed ? 1 : 0;
}

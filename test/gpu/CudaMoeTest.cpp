//===- CudaMoeTest.cpp - the CUDA MoE kernels against the CPU kernels -----===//
//
// Every MoE kernel (docs/moe.md) on the device against the CPU backend's
// kernel on the same inputs (runtime/src/backend/cpu/Moe.cpp: sums in
// double, routing by MoeRouting.cpp's rules). Integer outputs (experts,
// slots, counts) must be equal element for element; float outputs within a
// relative norm tolerance. Inputs are built to hit the rules' corners: tied
// logits and probabilities (few distinct values), capacity drops with ties
// at the threshold, experts nobody picks, top-1 and top-2 (and k past one
// warp's lanes), more choices than one block's scan. Both storage modes:
// f32, and bf16 (rank >= 2 float operands stored bf16, as the backend stores
// activations; the CPU sees the same bf16-rounded inputs). Outputs are
// poisoned (all bits set) first, so an unwritten element fails. Also: the
// grouped GEMM reading moe_assign's counts through the host mirror, a
// counts buffer rewritten after moe_assign (an Error), and bad expert ids
// and slots (Errors at the next synchronize).
//
// Usage: mapp-cuda-moe-test [substring]. Exit 77 without a GPU, 1 on a
// failure.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

std::mt19937_64 rng(12345);
std::vector<void *> gKeep; // device buffers, freed at exit (no address reuse)
std::string gOnly;
int gFailed = 0, gTotal = 0;

float roundBf16(float x) { return bf16ToFloat(floatToBf16(x)); }

/// One operand: host values and how the device stores it.
struct Arg {
  TensorType t;
  std::vector<float> f;
  std::vector<int32_t> i;
  bool f32Only = false; // stays fp32 in bf16 mode (parameter gradients)
  void *data() { return t.dtype == DType::I32 ? (void *)i.data() : (void *)f.data(); }
};

Arg F(Shape s, std::vector<float> v) {
  Arg a{{DType::F32, std::move(s)}, std::move(v), {}};
  return a;
}
Arg I(Shape s, std::vector<int32_t> v) {
  Arg a{{DType::I32, std::move(s)}, {}, std::move(v)};
  return a;
}
Arg outF(Shape s, bool f32Only = false) {
  Arg a{{DType::F32, s}, std::vector<float>(TensorType{DType::F32, s}.numel()), {}};
  a.f32Only = f32Only;
  return a;
}
Arg outI(Shape s) {
  return Arg{{DType::I32, s}, {}, std::vector<int32_t>(TensorType{DType::I32, s}.numel())};
}

bool storedBf16(const Arg &a, bool bf16) {
  return bf16 && !a.f32Only && a.t.dtype == DType::F32 && a.t.rank() >= 2;
}

std::vector<float> normal(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (auto &x : v)
    x = d(rng);
  return v;
}

/// Logits [n, e] with ties: values from {0, 0.5, 1, ...} (few distinct), and
/// experts in `dead` at -30 (never picked while k <= e - |dead|).
std::vector<float> logits(int64_t n, int64_t e, bool ties,
                          std::vector<int> dead = {}) {
  std::vector<float> v = normal(n * e);
  if (ties)
    for (auto &x : v)
      x = std::round(x * 2) / 2;
  for (int64_t r = 0; r < n; ++r)
    for (int d : dead)
      v[r * e + d] = -30;
  return v;
}

/// The CPU kernel on `in` (already rounded as the device stores them).
std::vector<Arg> runCpu(Backend &cpu, const std::string &kernel,
                        const Attrs &at, std::vector<Arg> in,
                        std::vector<Arg> out) {
  std::vector<Tensor> ti, to;
  for (auto &a : in)
    ti.push_back({a.data(), a.t});
  for (auto &a : out)
    to.push_back({a.data(), a.t});
  KernelContext ctx;
  ctx.pool = &cpu.pool();
  cpu.lookup(kernel)({at, ti.data(), (int)ti.size(), to.data(), (int)to.size(), ctx});
  return out;
}

Tensor upload(const Arg &a, bool bf16) {
  Tensor t{nullptr, a.t};
  int64_t n = a.t.numel();
  size_t bytes = std::max<int64_t>(n, 1) * (bf16 ? 2 : 4);
  if (cudaMalloc(&t.data, bytes) != cudaSuccess)
    fail("cudaMalloc failed");
  gKeep.push_back(t.data);
  cudaMemset(t.data, 0xFF, bytes); // poison
  cudaDeviceSynchronize(); // the backend's stream is non-blocking: no implicit order with this memset
  if (bf16) {
    t.type.dtype = DType::BF16;
    std::vector<uint16_t> b(n);
    for (int64_t i = 0; i < n; ++i)
      b[i] = floatToBf16(a.f[i]);
    cudaMemcpy(t.data, b.data(), n * 2, cudaMemcpyHostToDevice);
  } else if (n) {
    cudaMemcpy(t.data, a.t.dtype == DType::I32 ? (const void *)a.i.data()
                                               : (const void *)a.f.data(),
               n * 4, cudaMemcpyHostToDevice);
  }
  return t;
}

void download(const Tensor &t, Arg &a) {
  int64_t n = t.numel();
  if (t.type.dtype == DType::BF16) {
    std::vector<uint16_t> b(n);
    cudaMemcpy(b.data(), t.data, n * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; ++i)
      a.f[i] = bf16ToFloat(b[i]);
  } else if (n) {
    cudaMemcpy(a.data(), t.data, n * 4, cudaMemcpyDeviceToHost);
  }
}

/// The device kernel; `out` gets the results. Returns the Error text, or "".
std::string runGpu(Backend &gpu, const std::string &kernel, const Attrs &at,
                   std::vector<Tensor> &ti, std::vector<Tensor> &to) {
  KernelContext ctx;
  ctx.pool = &gpu.pool();
  ctx.backend = &gpu;
  try {
    gpu.lookup(kernel)({at, ti.data(), (int)ti.size(), to.data(), (int)to.size(), ctx});
    gpu.synchronize();
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

/// ‖got − want‖ / max(‖want‖, floor·√n): `floor` is the scale of an output
/// whose exact value is (near) zero, where a relative error measures only
/// the rounding of its cancelling terms.
double relErr(const std::vector<float> &got, const std::vector<float> &want,
              bool &bad, double floor = 0) {
  double num = 0, den = 0;
  bad = false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]))
      bad = true;
    double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  den = std::max(den, floor * floor * double(want.size()));
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool selected(const std::string &name) {
  return gOnly.empty() || name.find(gOnly) != std::string::npos;
}

void report(const std::string &name, bool bf16, bool ok, const std::string &what) {
  ++gTotal;
  gFailed += !ok;
  std::printf("%-5s %-52s %s  %s\n", bf16 ? "bf16" : "f32", name.c_str(),
              ok ? "ok  " : "FAIL", what.c_str());
}

/// One kernel call on both backends; every output compared. tol16: float
/// outputs in bf16 mode (stored bf16), tol32 otherwise.
void check(Backend &cpu, Backend &gpu, const std::string &name,
           const std::string &kernel, const Attrs &at, std::vector<Arg> in,
           std::vector<Arg> out, double tol32 = 1e-5, double tol16 = 1e-2,
           double floor = 0) {
  for (bool bf16 : {false, true}) {
    if (!selected(name))
      continue;
    std::vector<Arg> rin = in;
    for (auto &a : rin)
      if (storedBf16(a, bf16))
        for (auto &x : a.f)
          x = roundBf16(x);
    std::vector<Arg> want = runCpu(cpu, kernel, at, rin, out);
    std::vector<Tensor> ti, to;
    for (auto &a : rin)
      ti.push_back(upload(a, storedBf16(a, bf16)));
    for (auto &a : out)
      to.push_back(upload(a, storedBf16(a, bf16)));
    // upload() poisons before copying; outputs start poisoned:
    for (size_t i = 0; i < out.size(); ++i)
      cudaMemset(to[i].data, 0xFF, std::max<int64_t>(to[i].numel(), 1) *
                                       (to[i].type.dtype == DType::BF16 ? 2 : 4));
    cudaDeviceSynchronize(); // the backend's stream is non-blocking: no implicit order with this memset
    std::string err = runGpu(gpu, kernel, at, ti, to);
    if (!err.empty()) {
      report(name, bf16, false, err);
      continue;
    }
    bool ok = true;
    std::string what;
    for (size_t i = 0; i < out.size(); ++i) {
      Arg got = out[i];
      download(to[i], got);
      char buf[160];
      if (got.t.dtype == DType::I32) {
        int64_t diff = 0, first = -1;
        for (size_t j = 0; j < got.i.size(); ++j)
          if (got.i[j] != want[i].i[j]) {
            ++diff;
            if (first < 0)
              first = static_cast<int64_t>(j);
          }
        if (diff) {
          ok = false;
          std::snprintf(buf, sizeof buf, "out%zu: %lld of %zu ints differ (first at %lld: %d vs cpu %d) ",
                        i, (long long)diff, got.i.size(), (long long)first,
                        got.i[first], want[i].i[first]);
        } else {
          std::snprintf(buf, sizeof buf, "out%zu: %zu ints equal ", i, got.i.size());
        }
      } else {
        bool bad;
        double e = relErr(got.f, want[i].f, bad, floor);
        double tol = storedBf16(out[i], bf16) ? tol16 : tol32;
        bool fine = !bad && e <= tol;
        ok &= fine;
        std::snprintf(buf, sizeof buf, "out%zu: rel %.1e (tol %.0e)%s ", i, e,
                      tol, bad ? " NaN/unwritten" : "");
      }
      what += buf;
    }
    report(name, bf16, ok, what);
  }
}

Attrs ints(std::initializer_list<std::pair<const char *, int64_t>> kv) {
  Attrs a;
  for (auto &p : kv)
    a.setInt(p.first, p.second);
  return a;
}
Attrs coeff(double c) {
  Attrs a;
  a.setFloat("coeff", c);
  return a;
}

/// Router outputs on the CPU for logits [n, e] (probs f32, experts).
std::pair<std::vector<float>, std::vector<int32_t>>
route(Backend &cpu, const std::vector<float> &l, int64_t n, int64_t e, int64_t k) {
  auto out = runCpu(cpu, "moe_router", ints({{"topk", k}}), {F({n, e}, l)},
                    {outF({n, k}), outI({n, k})});
  return {out[0].f, out[1].i};
}

/// slots and counts on the CPU.
std::pair<std::vector<int32_t>, std::vector<int32_t>>
assign(Backend &cpu, const std::vector<float> &p, const std::vector<int32_t> &ex,
       int64_t n, int64_t k, int64_t e, int64_t cap) {
  Attrs at = ints({{"num_experts", e}});
  if (cap > 0)
    at.setInt("capacity", cap);
  auto out = runCpu(cpu, "moe_assign", at, {F({n, k}, p), I({n, k}, ex)},
                    {outI({n, k}), outI({e})});
  return {out[0].i, out[1].i};
}

int64_t capacityFor(int64_t n, int64_t k, int64_t e, double factor) {
  return std::max<int64_t>(static_cast<int64_t>(std::ceil(n * k / double(e) * factor)), 1);
}

void routerCases(Backend &cpu, Backend &gpu) {
  struct R { int64_t n, e, k; bool ties; std::vector<int> dead; };
  for (const R &r : std::vector<R>{{300, 8, 1, false, {}}, {300, 8, 2, false, {}},
                                   {300, 8, 2, true, {}}, {257, 64, 2, true, {5}},
                                   {100, 40, 6, true, {}}, {50, 4, 4, true, {}},
                                   {40, 72, 36, true, {}}}) {
    std::string n = "router n" + std::to_string(r.n) + " e" + std::to_string(r.e) +
                    " k" + std::to_string(r.k) + (r.ties ? " ties" : "");
    check(cpu, gpu, n, "moe_router", ints({{"topk", r.k}}),
          {F({r.n, r.e}, logits(r.n, r.e, r.ties, r.dead))},
          {outF({r.n, r.k}), outI({r.n, r.k})}, 1e-6, 1e-2);
    // The gradient at the CPU's routing of fresh logits.
    auto [p, ex] = route(cpu, logits(r.n, r.e, false), r.n, r.e, r.k);
    check(cpu, gpu, "router_grad e" + std::to_string(r.e) + " k" + std::to_string(r.k),
          "moe_router_grad", {}, {F({r.n, r.k}, normal(r.n * r.k)), F({r.n, r.k}, p),
                                 I({r.n, r.k}, ex)},
          {outF({r.n, r.e})}, 1e-5, 1e-2);
  }
}

void assignCases(Backend &cpu, Backend &gpu) {
  struct A { int64_t n, e, k; bool ties; std::vector<int> dead; double factor; };
  // factor 0: dropless. 2600 tokens × 2 choices: past two 1024-thread scans.
  for (const A &a : std::vector<A>{{300, 8, 1, false, {}, 0}, {300, 8, 2, false, {}, 0},
                                   {300, 8, 2, true, {2, 6}, 0}, {300, 8, 2, false, {}, 1.0},
                                   {300, 8, 1, true, {}, 1.0}, {300, 8, 2, true, {3}, 0.5},
                                   {2600, 8, 2, true, {}, 1.0}, {2600, 8, 2, false, {}, 1.25},
                                   {2600, 16, 2, true, {0, 1}, 0}, {500, 64, 2, true, {}, 0.7},
                                   {10, 4, 2, false, {}, 0.1}}) {
    auto [p, ex] = route(cpu, logits(a.n, a.e, a.ties, a.dead), a.n, a.e, a.k);
    int64_t cap = a.factor > 0 ? capacityFor(a.n, a.k, a.e, a.factor) : 0;
    // How many choices the capacity drops (the case must drop some to count).
    int64_t dropped = 0;
    if (cap) {
      std::vector<int64_t> c(a.e, 0);
      for (int32_t x : ex)
        ++c[x];
      for (int64_t x : c)
        dropped += std::max<int64_t>(x - cap, 0);
    }
    std::string n = "assign n" + std::to_string(a.n) + " e" + std::to_string(a.e) +
                    " k" + std::to_string(a.k) + (a.ties ? " ties" : "") +
                    (a.dead.empty() ? "" : " empty-experts") +
                    (cap ? " cap " + std::to_string(cap) + " (" + std::to_string(dropped) + " dropped)"
                         : " dropless");
    Attrs at = ints({{"num_experts", a.e}});
    if (cap)
      at.setInt("capacity", cap);
    check(cpu, gpu, n, "moe_assign", at, {F({a.n, a.k}, p), I({a.n, a.k}, ex)},
          {outI({a.n, a.k}), outI({a.e})});
  }
  // Equal probabilities everywhere: the capacity keeps the lowest tokens.
  {
    int64_t n = 700, e = 4, k = 2;
    std::vector<float> p(n * k, 0.5f);
    std::vector<int32_t> ex(n * k);
    for (int64_t i = 0; i < n * k; ++i)
      ex[i] = static_cast<int32_t>((i / k + i % k) % e);
    check(cpu, gpu, "assign all probabilities equal, cap 100", "moe_assign",
          ints({{"num_experts", e}, {"capacity", 100}}),
          {F({n, k}, p), I({n, k}, ex)}, {outI({n, k}), outI({e})});
  }
}

void permuteCases(Backend &cpu, Backend &gpu) {
  for (int64_t h : {int64_t(96), int64_t(36)}) {
    for (double factor : {0.0, 1.0}) {
      int64_t n = 333, e = 8, k = 2, rows = n * k;
      auto [p, ex] = route(cpu, logits(n, e, true, {4}), n, e, k);
      int64_t cap = factor > 0 ? capacityFor(n, k, e, factor) : 0;
      auto [slots, counts] = assign(cpu, p, ex, n, k, e, cap);
      std::string s = " h" + std::to_string(h) + (cap ? " cap" : " dropless");
      check(cpu, gpu, "permute" + s, "moe_permute", {},
            {F({n, h}, normal(n * h)), I({n, k}, slots)}, {outF({rows, h})});
      check(cpu, gpu, "permute_grad" + s, "moe_permute_grad", {},
            {F({rows, h}, normal(rows * h)), I({n, k}, slots)}, {outF({n, h})});
      check(cpu, gpu, "unpermute" + s, "moe_unpermute", {},
            {F({rows, h}, normal(rows * h)), F({n, k}, p), I({n, k}, slots)},
            {outF({n, h})});
      check(cpu, gpu, "unpermute_grad" + s, "moe_unpermute_grad", {},
            {F({n, h}, normal(n * h)), F({rows, h}, normal(rows * h)), F({n, k}, p),
             I({n, k}, slots)},
            {outF({rows, h}), outF({n, k})}, 1e-5, 1e-2);
    }
  }
}

void groupedCases(Backend &cpu, Backend &gpu) {
  struct G { int64_t e, kd, nd; std::vector<int32_t> counts; int64_t rows; };
  for (const G &g : std::vector<G>{{4, 64, 96, {30, 0, 17, 50}, 120},
                                   {8, 128, 64, {0, 0, 5, 1, 100, 0, 33, 0}, 139},
                                   {3, 40, 24, {7, 9, 0}, 16},
                                   {2, 32, 48, {0, 0}, 10}}) {
    std::string s = " e" + std::to_string(g.e) + " " + std::to_string(g.kd) + "x" +
                    std::to_string(g.nd) + " rows " + std::to_string(g.rows);
    auto rb = [](std::vector<float> v) { // GEMM operands are bf16 on the device
      for (auto &x : v)
        x = roundBf16(x);
      return v;
    };
    for (bool tb : {false, true}) {
      Attrs at;
      if (tb)
        at.setInt("transpose_b", 1);
      Shape ws = tb ? Shape{g.e, g.nd, g.kd} : Shape{g.e, g.kd, g.nd};
      check(cpu, gpu, std::string("grouped_matmul") + (tb ? " tb" : "") + s,
            "moe_grouped_matmul", at,
            {F({g.rows, g.kd}, rb(normal(g.rows * g.kd))),
             F(ws, rb(normal(g.e * g.kd * g.nd))), I({g.e}, g.counts)},
            {outF({g.rows, g.nd})}, 1e-4, 1e-2);
    }
    check(cpu, gpu, "grouped_matmul_wgrad" + s, "moe_grouped_matmul_wgrad", {},
          {F({g.rows, g.kd}, rb(normal(g.rows * g.kd))),
           F({g.rows, g.nd}, rb(normal(g.rows * g.nd))), I({g.e}, g.counts)},
          {outF({g.e, g.kd, g.nd}, true)}, 1e-4, 1e-4);
  }
}

void lossCases(Backend &cpu, Backend &gpu) {
  struct L { int64_t n, e, k; };
  for (const L &l : std::vector<L>{{300, 8, 2}, {1000, 8, 1}, {77, 64, 2}, {5, 4, 4}}) {
    std::string s = " n" + std::to_string(l.n) + " e" + std::to_string(l.e) +
                    " k" + std::to_string(l.k);
    std::vector<float> lg = logits(l.n, l.e, false);
    auto [p, ex] = route(cpu, lg, l.n, l.e, l.k);
    check(cpu, gpu, "aux_loss" + s, "moe_aux_loss", coeff(0.01),
          {F({l.n, l.e}, lg), I({l.n, l.k}, ex)}, {outF({})}, 1e-5, 1e-2);
    // k = e: every expert gets every token, the gradient is exactly zero;
    // judged against its terms' size, dloss·coeff·e/(n·k)·count/n.
    double terms = l.k == l.e ? 1.7 * 0.01 * double(l.e) / double(l.n * l.k) : 0;
    check(cpu, gpu, "aux_loss_grad" + s, "moe_aux_loss_grad", coeff(0.01),
          {F({}, {1.7f}), F({l.n, l.e}, lg), I({l.n, l.k}, ex)},
          {outF({l.n, l.e})}, 1e-5, 1e-2, terms);
    check(cpu, gpu, "z_loss" + s, "moe_z_loss", coeff(0.001),
          {F({l.n, l.e}, lg)}, {outF({})}, 1e-5, 1e-2);
    check(cpu, gpu, "z_loss_grad" + s, "moe_z_loss_grad", coeff(0.001),
          {F({}, {0.6f}), F({l.n, l.e}, lg)}, {outF({l.n, l.e})}, 1e-5, 1e-2);
  }
}

/// moe_assign on the device, then the grouped GEMM on its counts (the host
/// mirror), and again after the counts buffer was overwritten (an Error).
void mirrorCases(Backend &cpu, Backend &gpu) {
  if (!selected("mirror"))
    return;
  int64_t n = 200, e = 4, k = 2, kd = 32, nd = 40, rows = n * k;
  auto [p, ex] = route(cpu, logits(n, e, false, {1}), n, e, k);
  auto [slots, counts] = assign(cpu, p, ex, n, k, e, 0);
  std::vector<Tensor> ai = {upload(F({n, k}, p), false), upload(I({n, k}, ex), false)};
  std::vector<Tensor> ao = {upload(outI({n, k}), false), upload(outI({e}), false)};
  std::string err = runGpu(gpu, "moe_assign", ints({{"num_experts", e}}), ai, ao);
  std::vector<float> x = normal(rows * kd), w = normal(e * kd * nd);
  for (auto &v : x) v = roundBf16(v);
  for (auto &v : w) v = roundBf16(v);
  auto want = runCpu(cpu, "moe_grouped_matmul", {},
                     {F({rows, kd}, x), F({e, kd, nd}, w), I({e}, counts)},
                     {outF({rows, nd})});
  std::vector<Tensor> gi = {upload(F({rows, kd}, x), false),
                            upload(F({e, kd, nd}, w), false), ao[1]};
  std::vector<Tensor> go = {upload(outF({rows, nd}), false)};
  if (err.empty())
    err = runGpu(gpu, "moe_grouped_matmul", {}, gi, go);
  Arg got = outF({rows, nd});
  download(go[0], got);
  bool bad;
  double rel = relErr(got.f, want[0].f, bad);
  bool ok = err.empty() && !bad && rel < 1e-4;
  report("grouped_matmul on moe_assign's counts (mirror)", false, ok,
         err.empty() ? "rel " + std::to_string(rel) : err);
  // Rewrite the counts behind the mirror's back: the check must object.
  std::vector<int32_t> other = counts;
  std::swap(other[0], other[2]);
  cudaMemcpy(ao[1].data, other.data(), e * 4, cudaMemcpyHostToDevice);
  err = runGpu(gpu, "moe_grouped_matmul", {}, gi, go);
  ok = err.find("rewrote the buffer") != std::string::npos;
  report("grouped_matmul on rewritten counts -> Error", false, ok, err);
}

void errorCases(Backend &gpu) {
  if (!selected("error"))
    return;
  std::vector<Tensor> ai = {upload(F({3, 2}, std::vector<float>(6, 0.5f)), false),
                            upload(I({3, 2}, {0, 1, 2, 9, 1, 0}), false)};
  std::vector<Tensor> ao = {upload(outI({3, 2}), false), upload(outI({4}), false)};
  std::string err = runGpu(gpu, "moe_assign", ints({{"num_experts", 4}}), ai, ao);
  report("assign expert id 9 -> Error", false,
         err.find("expert id 9 at choice 3 is outside [0, 4)") != std::string::npos, err);
  std::vector<Tensor> pi = {upload(F({3, 8}, normal(24)), false),
                            upload(I({3, 2}, {0, 1, 2, -1, 7, 3}), false)};
  std::vector<Tensor> po = {upload(outF({6, 8}), false)};
  err = runGpu(gpu, "moe_permute", {}, pi, po);
  report("permute slot 7 of 6 rows -> Error", false,
         err.find("slot 7 at choice 4 is outside [-1, 6)") != std::string::npos, err);
  std::vector<Tensor> gi = {upload(F({10, 8}, normal(80)), false),
                            upload(F({2, 8, 8}, normal(128)), false),
                            upload(I({2}, {6, 5}), false)};
  std::vector<Tensor> go = {upload(outF({10, 8}), false)};
  err = runGpu(gpu, "moe_grouped_matmul", {}, gi, go);
  report("grouped_matmul counts sum 11 > 10 rows -> Error", false,
         err.find("sum to 11 rows, more than the 10 rows") != std::string::npos, err);
}

} // namespace

int main(int argc, char **argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  gOnly = argc > 1 ? argv[1] : "";
  std::unique_ptr<Backend> cpu = createCpuBackend(4);
  std::unique_ptr<Backend> gpu = createCudaBackend(0);
  try {
    routerCases(*cpu, *gpu);
    assignCases(*cpu, *gpu);
    permuteCases(*cpu, *gpu);
    groupedCases(*cpu, *gpu);
    lossCases(*cpu, *gpu);
    mirrorCases(*cpu, *gpu);
    errorCases(*gpu);
  } catch (const std::exception &e) {
    std::printf("FAIL: %s\n", e.what());
    ++gFailed;
  }
  for (void *p : gKeep)
    cudaFree(p);
  std::printf("cuda moe kernel check: %d/%d passed\n", gTotal - gFailed, gTotal);
  return gFailed ? 1 : 0;
}

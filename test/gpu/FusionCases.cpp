//===- FusionCases.cpp - fused GEMM pairs vs unfused vs fp64 --------------===//
//
// Also the optimizer groups (multi-tensor adamw / sgd): grouped vs
// per-parameter bit for bit, both vs the fp64 torch formulas.
//
// Each case is a two-to-five instruction program shaped like the compiled
// GPT plans (linear → gelu; reshape → wgrad matmul → reduce_sum →
// grad_accumulate ×2), bound to the CUDA backend and run through
// Backend::lookup with the instrs' own attrs and the backend's operand views,
// as the executor does. The arena starts poisoned (NaN), the Grad buffers
// with random values (so beta = 1 accumulation is checked). Checks: the
// backend reports the expected fusions (none with MAPP_CUDA_FUSE=0); fused
// and unfused outputs each within 1e-2 of the fp64 reference (bf16
// operands); fused vs unfused within 1e-2; and, as evidence the
// accumulation was fused, the wgrad contribution is never written.
//
//===----------------------------------------------------------------------===//
#include "FusionCases.h"
#include "Fp64Reference.h"
#include "Fusion.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Plan.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;
using namespace mapp::test;

namespace {

std::mt19937_64 rng(12345);

/// A program under construction plus its storage on the device.
struct MiniProgram {
  Program p;
  void *pool = nullptr, *arena = nullptr;

  int value(const char *name, ValueKind kind, Shape shape,
            DType dtype = DType::F32) {
    Value v;
    v.name = name;
    v.kind = kind;
    v.type = {dtype, std::move(shape)};
    v.bytes = v.type.numel() * dtypeSize(dtype);
    uint64_t &top = inArena(kind) ? p.arenaBytes : p.persistentBytes;
    v.offset = top;
    top += (v.bytes + 255) / 256 * 256;
    p.values.push_back(v);
    return static_cast<int>(p.values.size()) - 1;
  }
  Instr &instr(const char *kernel, std::vector<int> in, std::vector<int> out) {
    if (p.blocks.empty())
      p.blocks.emplace_back();
    Instr i;
    i.kernel = kernel;
    i.inputs = std::move(in);
    i.outputs = std::move(out);
    p.blocks[0].instrs.push_back(i);
    return p.blocks[0].instrs.back();
  }
  void *addr(int v) const {
    const Value &val = p.values[v];
    return static_cast<uint8_t *>(inArena(val.kind) ? arena : pool) + val.offset;
  }
};

std::vector<float> randoms(int64_t n, bool bf16) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (auto &x : v) {
    x = nd(rng);
    if (bf16)
      x = bf16ToFloat(floatToBf16(x));
  }
  return v;
}

/// Binds `mp` with MAPP_CUDA_FUSE=fuse, writes the inputs, runs every instr
/// and returns each requested value as the device stored it.
/// Params are read as their fp32 masters; `readShadows` lists Params whose
/// bf16 shadows are returned after the `read` values.
std::vector<std::vector<float>>
run(Backend &gpu, MiniProgram &mp, const char *fuse,
    const std::vector<std::pair<int, std::vector<float>>> &inputs,
    const std::vector<int> &read, std::string &summary, int64_t step = 0,
    const std::vector<int> &readShadows = {}) {
  setenv("MAPP_CUDA_FUSE", fuse, 1);
  const Program &p = mp.p;
  if (!mp.pool) {
    mp.pool = gpu.allocate(p.persistentBytes);
    mp.arena = gpu.allocate(p.arenaBytes);
  }
  cudaMemset(mp.arena, 0xFF, p.arenaBytes); // NaN: unwritten values show
  cudaDeviceSynchronize(); // the backend's stream is non-blocking: no implicit order with this memset
  gpu.bindProgram(p, mp.pool, mp.arena);
  summary = mapp::rt::cuda::fusionSummary(gpu);
  Instr probe; // any instr: operandView only looks at the value
  auto viewOf = [&](const Instr &in, int v, bool out) {
    return gpu.operandView(p, in, v, out, {mp.addr(v), p.values[v].type});
  };
  for (auto &[v, data] : inputs) {
    Tensor t = viewOf(probe, v, false);
    if (p.values[v].kind == ValueKind::Param)
      t = {mp.addr(v), p.values[v].type}; // the fp32 master; shadows follow
    if (t.type.dtype == DType::BF16) {
      std::vector<uint16_t> b(data.size());
      for (size_t i = 0; i < data.size(); ++i)
        b[i] = floatToBf16(data[i]);
      cudaMemcpy(t.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
    } else if (t.type.dtype == DType::I32) { // counts: whole numbers
      std::vector<int32_t> c(data.begin(), data.end());
      cudaMemcpy(t.data, c.data(), c.size() * 4, cudaMemcpyHostToDevice);
    } else {
      cudaMemcpy(t.data, data.data(), data.size() * 4, cudaMemcpyHostToDevice);
    }
  }
  gpu.beginStep(0); // refreshes the bf16 shadows of the Params
  KernelContext ctx;
  ctx.backend = &gpu;
  ctx.pool = &gpu.pool();
  ctx.step = step;
  for (const Instr &in : p.blocks[0].instrs) {
    std::vector<Tensor> ti, to;
    for (int v : in.inputs)
      ti.push_back(viewOf(in, v, false));
    for (int v : in.outputs)
      to.push_back(viewOf(in, v, true));
    gpu.lookup(in.kernel)({in.attrs, ti.data(), (int)ti.size(), to.data(),
                           (int)to.size(), ctx});
  }
  gpu.synchronize();
  std::vector<std::vector<float>> out;
  std::vector<std::pair<int, bool>> reads; // value, as its shadow
  for (int v : read)
    reads.push_back({v, false});
  for (int v : readShadows)
    reads.push_back({v, true});
  for (auto [v, shadow] : reads) {
    Tensor t = viewOf(probe, v, true);
    if (p.values[v].kind == ValueKind::Param && !shadow)
      t = {mp.addr(v), p.values[v].type};
    int64_t n = t.numel();
    std::vector<float> h(n);
    if (t.type.dtype == DType::BF16) {
      std::vector<uint16_t> b(n);
      cudaMemcpy(b.data(), t.data, n * 2, cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n; ++i)
        h[i] = bf16ToFloat(b[i]);
    } else {
      cudaMemcpy(h.data(), t.data, n * 4, cudaMemcpyDeviceToHost);
    }
    out.push_back(std::move(h));
  }
  return out;
}

double relDiff(const std::vector<float> &a, const std::vector<double> &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i]))
      return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

struct Checker {
  FusionTally t;
  void check(const std::string &what, bool ok, const std::string &detail) {
    ++t.total;
    t.failed += !ok;
    std::printf("%-5s %-34s %s  %s\n", "bf16", what.c_str(), ok ? "ok  " : "FAIL",
                detail.c_str());
  }
  void near(const std::string &what, const std::vector<float> &out,
            const std::vector<double> &ref, double tol) {
    double e = relDiff(out, ref);
    char buf[96];
    std::snprintf(buf, sizeof buf, "rel %.2e (tol %.0e)", e, tol);
    check(what, e <= tol, buf);
  }
};

std::vector<double> widen(const std::vector<float> &v) {
  return {v.begin(), v.end()};
}

/// A pair's program run fused (MAPP_CUDA_FUSE=fuse) and unfused, reading
/// `outputs` (the first is the result) and, on the fused run only,
/// `skipped`, the value the pair must never write; then the checks every
/// pair shares: the planner found it (`counter` "N" with fusion, "0"
/// without), cuBLASLt refused no GEMM plan on the fused run (a refusal falls
/// back to the unfused kernels, whose results pass every numeric check),
/// and `skipped` stayed poisoned.
struct PairRuns {
  std::vector<std::vector<float>> fused, plain;
};
PairRuns runPair(Backend &gpu, Checker &ck, MiniProgram &mp, const std::string &name,
                 const char *fuse, const std::string &counter,
                 const std::vector<std::pair<int, std::vector<float>>> &in,
                 std::vector<int> outputs, int skipped) {
  std::string sFused, sPlain;
  std::vector<int> readFused = outputs;
  readFused.push_back(skipped);
  int refusedBefore = mapp::rt::cuda::gemmRefusals();
  PairRuns r{run(gpu, mp, fuse, in, readFused, sFused), {}};
  int refused = mapp::rt::cuda::gemmRefusals() - refusedBefore;
  r.plain = run(gpu, mp, "0", in, outputs, sPlain);
  ck.check(name + " found", sFused.find(counter + " 1") != std::string::npos &&
                                sPlain.find(counter + " 0") != std::string::npos,
           sFused + " / unfused: " + sPlain);
  ck.check(name + " on cuBLASLt's epilogue", refused == 0,
           std::to_string(refused) + " GEMM plan(s) refused");
  bool untouched = true;
  for (float v : r.fused.back())
    untouched &= std::isnan(v);
  ck.check(name + " skips " + mp.p.values[skipped].name, untouched,
           untouched ? "still poisoned after the fused run"
                     : "written by the fused run");
  return r;
}

/// A linear's operands in a MiniProgram: x [2,70,K], w [N,K] and, with a
/// bias, b [N]; random host values as the device reads them (bf16-stored x,
/// the bf16 shadows of w and b), and the fp64 product x·wᵀ (+ b).
struct LinearInputs {
  static constexpr int64_t R = 2 * 70, K = 96, N = 160;
  std::vector<int> operands; // x, w (, b): the linear instr's inputs
  std::vector<std::pair<int, std::vector<float>>> host;
  Doubles ref;
};

LinearInputs linearInputs(MiniProgram &mp, bool withBias) {
  const int64_t R = LinearInputs::R, K = LinearInputs::K, N = LinearInputs::N;
  LinearInputs li;
  li.operands = {mp.value("x", ValueKind::Temp, {2, 70, K}),
                 mp.value("w", ValueKind::Param, {N, K})};
  if (withBias)
    li.operands.push_back(mp.value("b", ValueKind::Param, {N}));
  auto hx = randoms(R * K, true), hw = randoms(N * K, true), hb = randoms(N, true);
  li.ref = linearRef(hx.data(), hw.data(), withBias ? hb.data() : nullptr, R, N, K);
  li.host = {{li.operands[0], std::move(hx)}, {li.operands[1], std::move(hw)}};
  if (withBias)
    li.host.push_back({li.operands[2], std::move(hb)});
  return li;
}

void linearGeluCase(Backend &gpu, Checker &ck, bool withBias) {
  const int64_t N = LinearInputs::N;
  auto mp = std::make_unique<MiniProgram>();
  LinearInputs li = linearInputs(*mp, withBias);
  int pre = mp->value("pre", ValueKind::Temp, {2, 70, N});
  int act = mp->value("act", ValueKind::Temp, {2, 70, N});
  mp->instr("linear", li.operands, {pre});
  mp->instr("gelu", {pre}, {act}).attrs.setStr("approximate", "tanh");
  const auto &in = li.host;
  const Doubles &refPre = li.ref;
  std::vector<double> refAct(refPre.size());
  for (size_t i = 0; i < refPre.size(); ++i)
    refAct[i] = geluTanh(refPre[i]);
  std::string name = withBias ? "fused linear+bias+gelu" : "fused linear+gelu";
  std::string sFused, sPlain;
  int refusedBefore = mapp::rt::cuda::gemmRefusals();
  auto fused = run(gpu, *mp, "1", in, {pre, act}, sFused);
  int refused = mapp::rt::cuda::gemmRefusals() - refusedBefore;
  auto plain = run(gpu, *mp, "0", in, {pre, act}, sPlain);
  ck.check(name + " found", sFused.find("linear+gelu 1") == 0 &&
                                 sPlain.find("linear+gelu 0") == 0,
           sFused + " / unfused: " + sPlain);
  // The pair must run as one cuBLASLt call, not fall back to two kernels
  // (whose results would pass every numeric check above).
  ck.check(name + " on cuBLASLt's epilogue", refused == 0,
           std::to_string(refused) + " GEMM plan(s) refused");
  ck.near(name + " pre vs fp64", fused[0], refPre, 1e-2);
  ck.near(name + " act vs fp64", fused[1], refAct, 1e-2);
  ck.near(name + " unfused act vs fp64", plain[1], refAct, 1e-2);
  ck.near(name + " fused vs unfused", fused[1], widen(plain[1]), 1e-2);
  static std::vector<std::unique_ptr<MiniProgram>> keep; // attrs addresses
  keep.push_back(std::move(mp));
}

void wgradCase(Backend &gpu, Checker &ck) {
  const int64_t B = 2, T = 70, R = B * T, M = 48, N = 96;
  auto mp = std::make_unique<MiniProgram>();
  int dy3 = mp->value("dy", ValueKind::Temp, {B, T, M});
  int dy = mp->value("dy2", ValueKind::Temp, {R, M});
  int x = mp->value("x", ValueKind::Temp, {R, N});
  int dwPart = mp->value("dw.part", ValueKind::Temp, {M, N});
  int dbPart = mp->value("db.part", ValueKind::Temp, {M});
  int gw = mp->value("w.grad", ValueKind::Grad, {M, N});
  int gb = mp->value("b.grad", ValueKind::Grad, {M});
  mp->instr("reshape", {dy3}, {dy});
  mp->instr("matmul", {dy, x}, {dwPart}).attrs.setInt("transpose_a", 1);
  mp->instr("reduce_sum", {dy3}, {dbPart}).attrs.setInts("dims", {0, 1});
  mp->instr("grad_accumulate", {dwPart}, {gw});
  mp->instr("grad_accumulate", {dbPart}, {gb});
  auto hdy = randoms(R * M, true), hx = randoms(R * N, true);
  auto hgw = randoms(M * N, false), hgb = randoms(M, false);
  std::vector<double> refW(M * N), refB(M);
  for (int64_t m = 0; m < M; ++m) {
    double s = hgb[m];
    for (int64_t r = 0; r < R; ++r)
      s += hdy[r * M + m];
    refB[m] = s;
    for (int64_t n = 0; n < N; ++n) {
      double acc = hgw[m * N + n];
      for (int64_t r = 0; r < R; ++r)
        acc += double(hdy[r * M + m]) * hx[r * N + n];
      refW[m * N + n] = acc;
    }
  }
  std::vector<std::pair<int, std::vector<float>>> in = {
      {dy3, hdy}, {x, hx}, {gw, hgw}, {gb, hgb}};
  std::string sFused, sPlain;
  auto fused = run(gpu, *mp, "1", in, {gw, gb, dwPart}, sFused);
  auto plain = run(gpu, *mp, "0", in, {gw, gb, dwPart}, sPlain);
  ck.check("fused wgrad found",
           sFused.find("bgrad 1, accumulate 1") != std::string::npos &&
               sPlain.find("bgrad 0, accumulate 0") != std::string::npos,
           sFused + " / unfused: " + sPlain);
  bool untouched = true;
  for (float v : fused[2])
    untouched &= std::isnan(v);
  ck.check("fused wgrad skips the contribution", untouched,
           "dw.part still poisoned after the fused run");
  ck.near("fused wgrad dW (beta=1) vs fp64", fused[0], refW, 1e-2);
  ck.near("fused wgrad db (BGRADB) vs fp64", fused[1], refB, 1e-2);
  ck.near("unfused wgrad dW vs fp64", plain[0], refW, 1e-2);
  ck.near("unfused wgrad db vs fp64", plain[1], refB, 1e-2);
  ck.near("fused vs unfused dW", fused[0], widen(plain[0]), 1e-2);
  ck.near("fused vs unfused db", fused[1], widen(plain[1]), 1e-2);
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// linear (+bias) → add of its output and a residual r, in either operand
/// order: one GEMM writing x·wᵀ + b + r (beta = 1, C = r, D = the sum); the
/// linear's own output is never written.
void linearAddCase(Backend &gpu, Checker &ck, bool withBias, bool residualFirst) {
  const int64_t R = LinearInputs::R, N = LinearInputs::N;
  auto mp = std::make_unique<MiniProgram>();
  LinearInputs li = linearInputs(*mp, withBias);
  int r = mp->value("r", ValueKind::Temp, {2, 70, N});
  int y = mp->value("y", ValueKind::Temp, {2, 70, N});
  int sum = mp->value("sum", ValueKind::Temp, {2, 70, N});
  mp->instr("linear", li.operands, {y});
  mp->instr("add", residualFirst ? std::vector<int>{r, y} : std::vector<int>{y, r},
            {sum});
  auto hr = randoms(R * N, true);
  auto in = li.host;
  in.push_back({r, hr});
  Doubles &ref = li.ref;
  for (int64_t i = 0; i < R * N; ++i)
    ref[i] += hr[i];
  std::string name = std::string("fused linear") + (withBias ? "+bias" : "") +
                     "+add" + (residualFirst ? " (r first)" : "");
  auto [fused, plain] = runPair(gpu, ck, *mp, name, "1", "linear+add", in, {sum}, y);
  ck.near(name + " vs fp64", fused[0], ref, 1e-2);
  ck.near(name + " unfused vs fp64", plain[0], ref, 1e-2);
  ck.near(name + " fused vs unfused", fused[0], widen(plain[0]), 1e-2);
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// d/dx of the tanh GELU, in double.
double geluTanhGrad(double x) {
  const double c = std::sqrt(2.0 / M_PI), k = 0.044715;
  double t = std::tanh(c * (x + k * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * k * x * x);
}

/// matmul (fc2's data gradient dy·w) → gelu_grad of the product: one GEMM
/// with the DGELU epilogue at the gelu_grad; the product is never written.
void dgradGeluCase(Backend &gpu, Checker &ck) {
  const int64_t R = 2 * 70, K = 48, N = 160;
  auto mp = std::make_unique<MiniProgram>();
  int dy = mp->value("dy", ValueKind::Temp, {2, 70, K});
  int w = mp->value("w", ValueKind::Param, {K, N});
  int pre = mp->value("pre", ValueKind::Temp, {2, 70, N});
  int y = mp->value("dact", ValueKind::Temp, {2, 70, N});
  int dpre = mp->value("dpre", ValueKind::Temp, {2, 70, N});
  mp->instr("matmul", {dy, w}, {y});
  mp->instr("gelu_grad", {y, pre}, {dpre}).attrs.setStr("approximate", "tanh");
  auto hdy = randoms(R * K, true), hw = randoms(K * N, true);
  auto hpre = randoms(R * N, true);
  Doubles ref(R * N);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(hdy[r * K + k]) * hw[k * N + n];
      ref[r * N + n] = acc * geluTanhGrad(hpre[r * N + n]);
    }
  std::string name = "fused matmul+gelu_grad (DGELU)";
  std::vector<std::pair<int, std::vector<float>>> in = {{dy, hdy}, {w, hw}, {pre, hpre}};
  auto [fused, plain] = runPair(gpu, ck, *mp, name, "all", // dgelu is opt-in
                                "matmul+gelu_grad", in, {dpre}, y);
  ck.near(name + " vs fp64", fused[0], ref, 1e-2);
  ck.near(name + " unfused vs fp64", plain[0], ref, 1e-2);
  ck.near(name + " fused vs unfused", fused[0], widen(plain[0]), 1e-2);
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// moe_grouped_matmul_wgrad → grad_accumulate: each expert's GEMM adds
/// into the fp32 gradient (beta = 1), the grouped result never written; an
/// expert without rows leaves its gradient as it was, and rows past the
/// counts' sum count for no expert.
void expertWgradCase(Backend &gpu, Checker &ck) {
  const int64_t E = 3, R = 80, K = 48, N = 64;
  const std::vector<float> counts = {40, 0, 30};
  auto mp = std::make_unique<MiniProgram>();
  int x = mp->value("x", ValueKind::Temp, {R, K});
  int dy = mp->value("dy", ValueKind::Temp, {R, N});
  int c = mp->value("counts", ValueKind::Temp, {E}, DType::I32);
  int part = mp->value("dw.part", ValueKind::Temp, {E, K, N});
  int gw = mp->value("w.grad", ValueKind::Grad, {E, K, N});
  mp->instr("moe_grouped_matmul_wgrad", {x, dy, c}, {part});
  mp->instr("grad_accumulate", {part}, {gw});
  auto hx = randoms(R * K, true), hdy = randoms(R * N, true);
  auto hgw = randoms(E * K * N, false);
  Doubles ref(hgw.begin(), hgw.end());
  int64_t row = 0;
  for (int64_t g = 0; g < E; ++g)
    for (int64_t m = 0; m < counts[g]; ++m, ++row)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n)
          ref[(g * K + k) * N + n] += double(hx[row * K + k]) * hdy[row * N + n];
  std::string name = "fused expert wgrad (beta=1)";
  std::vector<std::pair<int, std::vector<float>>> in = {
      {x, hx}, {dy, hdy}, {c, counts}, {gw, hgw}};
  auto [fused, plain] = runPair(gpu, ck, *mp, name, "1", "accumulate", in, {gw}, part);
  ck.near(name + " vs fp64", fused[0], ref, 1e-2);
  ck.near(name + " unfused vs fp64", plain[0], ref, 1e-2);
  ck.near(name + " fused vs unfused", fused[0], widen(plain[0]), 1e-2);
  // Expert 1 has no rows: its gradient is the initial one, bit for bit.
  bool kept = std::equal(fused[0].begin() + K * N, fused[0].begin() + 2 * K * N,
                         hgw.begin() + K * N);
  ck.check(name + " empty expert", kept, kept ? "unchanged" : "changed");
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// layer_norm_grad → add of dx and a residual gradient: the norm backward
/// writes dx + r; dx itself is never written. H = 160 takes the 8-wide
/// kernel, H = 36 the scalar one.
void normGradAddCase(Backend &gpu, Checker &ck, int64_t H) {
  const int64_t R = 2 * 33;
  const double eps = 1e-5;
  auto mp = std::make_unique<MiniProgram>();
  int dy = mp->value("dy", ValueKind::Temp, {2, 33, H});
  int x = mp->value("x", ValueKind::Temp, {2, 33, H});
  int g = mp->value("g", ValueKind::Param, {H});
  int r = mp->value("r", ValueKind::Temp, {2, 33, H});
  int dx = mp->value("dx", ValueKind::Temp, {2, 33, H});
  int dg = mp->value("dg", ValueKind::Temp, {H});
  int db = mp->value("db", ValueKind::Temp, {H});
  int sum = mp->value("sum", ValueKind::Temp, {2, 33, H});
  mp->instr("layer_norm_grad", {dy, x, g}, {dx, dg, db}).attrs.setFloat("eps", eps);
  mp->instr("add", {r, dx}, {sum});
  auto hdy = randoms(R * H, true), hx = randoms(R * H, true);
  auto hg = randoms(H, false), hr = randoms(R * H, true);
  Doubles ref(R * H), refG(H, 0.0), refB(H, 0.0);
  for (int64_t i = 0; i < R; ++i) {
    const float *xr = &hx[i * H], *dyr = &hdy[i * H];
    double mean = 0, var = 0;
    for (int64_t c = 0; c < H; ++c)
      mean += xr[c];
    mean /= H;
    for (int64_t c = 0; c < H; ++c)
      var += (xr[c] - mean) * (xr[c] - mean);
    double rstd = 1 / std::sqrt(var / H + eps), sg = 0, sgx = 0;
    for (int64_t c = 0; c < H; ++c) {
      double xh = (xr[c] - mean) * rstd, gdy = dyr[c] * double(hg[c]);
      sg += gdy;
      sgx += gdy * xh;
      refG[c] += dyr[c] * xh;
      refB[c] += dyr[c];
    }
    for (int64_t c = 0; c < H; ++c) {
      double xh = (xr[c] - mean) * rstd, gdy = dyr[c] * double(hg[c]);
      ref[i * H + c] = rstd * (gdy - sg / H - xh * sgx / H) + hr[i * H + c];
    }
  }
  std::string name = "fused layer_norm_grad+add h=" + std::to_string(H);
  std::vector<std::pair<int, std::vector<float>>> in = {
      {dy, hdy}, {x, hx}, {g, hg}, {r, hr}};
  auto [fused, plain] =
      runPair(gpu, ck, *mp, name, "1", "norm_grad+add", in, {sum, dg, db}, dx);
  ck.near(name + " vs fp64", fused[0], ref, 1e-2);
  ck.near(name + " dgamma vs fp64", fused[1], refG, 1e-2);
  ck.near(name + " dbeta vs fp64", fused[2], refB, 1e-2);
  ck.near(name + " unfused vs fp64", plain[0], ref, 1e-2);
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// One optimizer instr of optimGroupCase: its shape, ZeRO range (lo < 0:
/// none) and weight decay.
struct OptimMember {
  Shape shape;
  int64_t lo, hi;
  double wd;
};

/// The fp64 torch update of one element (AdamW or SGD, single-tensor path).
void referenceUpdate(bool adam, int64_t step, double lr, double wd,
                     double coef, double &p, double g, double &m, double &v) {
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, mom = 0.9, damp = 0.1;
  g *= coef;
  if (adam) {
    double t = step + 1.0;
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double denom = std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps;
    p -= lr / (1 - std::pow(b1, t)) * (m / denom);
  } else {
    double d = g + wd * p;
    m = step == 0 ? d : mom * m + (1 - damp) * d;
    p -= lr * m;
  }
}

/// Six adamw (or sgd) instrs of different sizes, two with ZeRO ranges (one
/// empty), with a cosine lr schedule and a shared norm operand that clips,
/// each naming its parameter (`param`): the first five form one group,
/// the sixth (another weight decay) stays alone. Grouped and per-parameter
/// runs must agree bit for bit (masters, moments, shadows); both are checked
/// against the fp64 torch formulas, untouched outside the ZeRO ranges.
void optimGroupCase(Backend &gpu, Checker &ck, const std::string &kernel) {
  const bool adam = kernel == "adamw";
  const double lr = 1e-2, minLr = 1e-3, maxNorm = 1.0, norm = 3.0;
  const int64_t step = 2;
  // Cosine schedule, warmup 1 of 10 steps: step 2 is 1/9 into the decay.
  const double stepLr = minLr + 0.5 * (lr - minLr) * (1 + std::cos(M_PI / 9));
  const std::vector<OptimMember> members = {
      {{48, 40}, -1, -1, 0.1}, {{1000}, -1, -1, 0.1},
      {{3, 2500}, 100, 4100, 0.1}, {{7}, -1, -1, 0.1},
      {{64, 33}, 5, 5, 0.1}, {{30, 20}, -1, -1, 0.0}};
  auto mp = std::make_unique<MiniProgram>();
  int normV = mp->value("norm", ValueKind::Temp, {1});
  struct Ops {
    int p, g, m, v;
  };
  std::vector<Ops> ops;
  for (size_t k = 0; k < members.size(); ++k) {
    std::string n = "w" + std::to_string(k);
    Ops o;
    o.p = mp->value(n.c_str(), ValueKind::Param, members[k].shape);
    o.g = mp->value((n + ".grad").c_str(), ValueKind::Grad, members[k].shape);
    o.m = mp->value((n + ".m").c_str(), ValueKind::OptState, members[k].shape);
    o.v = adam ? mp->value((n + ".v").c_str(), ValueKind::OptState,
                           members[k].shape)
               : -1;
    ops.push_back(o);
  }
  // Compute readers give the rank-2 params their bf16 shadows.
  std::vector<int> shadowed;
  for (size_t k = 0; k < members.size(); ++k)
    if (members[k].shape.size() == 2) {
      int out = mp->value(("s" + std::to_string(k)).c_str(), ValueKind::Temp,
                          members[k].shape);
      mp->instr("scale", {ops[k].p}, {out}).attrs.setFloat("factor", 2.0);
      shadowed.push_back(ops[k].p);
    }
  for (size_t k = 0; k < members.size(); ++k) {
    std::vector<int> in = {ops[k].p, ops[k].g, ops[k].m};
    if (adam)
      in.push_back(ops[k].v);
    in.push_back(normV);
    Instr &i = mp->instr(kernel.c_str(), in, {});
    i.attrs.setStr("param", "w" + std::to_string(k)); // as compiled plans do
    i.attrs.setFloat("lr", lr);
    i.attrs.setStr("schedule", "cosine");
    i.attrs.setInt("warmup", 1);
    i.attrs.setInt("total_steps", 10);
    i.attrs.setFloat("min_lr", minLr);
    i.attrs.setFloat("max_norm", maxNorm);
    i.attrs.setFloat("weight_decay", members[k].wd);
    if (adam) {
      i.attrs.setFloat("beta2", 0.95);
    } else {
      i.attrs.setFloat("momentum", 0.9);
      i.attrs.setFloat("dampening", 0.1);
    }
    if (members[k].lo >= 0) {
      i.attrs.setInt("zero_begin", members[k].lo);
      i.attrs.setInt("zero_end", members[k].hi);
    }
  }
  std::vector<std::pair<int, std::vector<float>>> in = {
      {normV, {static_cast<float>(norm)}}};
  std::vector<int> read;
  for (size_t k = 0; k < members.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : members[k].shape)
      n *= d;
    for (int v : {ops[k].p, ops[k].g, ops[k].m, ops[k].v}) {
      if (v < 0)
        continue;
      std::vector<float> x = randoms(n, false);
      if (v == ops[k].v)
        for (float &e : x)
          e = std::fabs(e); // a second moment is non-negative
      in.push_back({v, x});
    }
    read.push_back(ops[k].p);
    read.push_back(ops[k].m);
    if (adam)
      read.push_back(ops[k].v);
  }
  std::string sFused, sPlain;
  auto fused = run(gpu, *mp, "1", in, read, sFused, step, shadowed);
  auto plain = run(gpu, *mp, "0", in, read, sPlain, step, shadowed);
  std::string word = adam ? "adam" : "sgd";
  ck.check(kernel + " group found",
           sFused.find(word + " 1 (5 instrs)") != std::string::npos &&
               sPlain.find(word + " 0 (0 instrs)") != std::string::npos,
           sFused + " / unfused: " + sPlain);
  bool same = fused.size() == plain.size();
  for (size_t r = 0; same && r < fused.size(); ++r)
    same = fused[r].size() == plain[r].size() &&
           std::memcmp(fused[r].data(), plain[r].data(),
                       fused[r].size() * sizeof(float)) == 0;
  ck.check(kernel + " grouped vs per-parameter", same,
           "masters, moments and shadows bit for bit");
  // fp64 reference, and nothing written outside the ZeRO ranges.
  double coef = std::min(maxNorm / (norm + 1e-6), 1.0);
  size_t r = 0;
  double worst = 0;
  bool outsideKept = true;
  auto initial = [&](int v) -> const std::vector<float> & {
    for (auto &kv : in)
      if (kv.first == v)
        return kv.second;
    fail("optimGroupCase: no input for value ", v);
  };
  for (size_t k = 0; k < members.size(); ++k) {
    const std::vector<float> &p0 = initial(ops[k].p), &g0 = initial(ops[k].g),
                             &m0 = initial(ops[k].m);
    const std::vector<float> *v0 = adam ? &initial(ops[k].v) : nullptr;
    const std::vector<float> &pOut = fused[r], &mOut = fused[r + 1];
    const std::vector<float> *vOut = adam ? &fused[r + 2] : nullptr;
    r += adam ? 3 : 2;
    int64_t n = static_cast<int64_t>(p0.size());
    int64_t lo = members[k].lo >= 0 ? members[k].lo : 0;
    int64_t hi = members[k].lo >= 0 ? members[k].hi : n;
    std::vector<double> refP, refM, refV;
    std::vector<float> gotP, gotM, gotV;
    for (int64_t i = 0; i < n; ++i) {
      if (i < lo || i >= hi) {
        outsideKept &= pOut[i] == p0[i] && mOut[i] == m0[i] &&
                       (!adam || (*vOut)[i] == (*v0)[i]);
        continue;
      }
      double p = p0[i], m = m0[i], v = adam ? (*v0)[i] : 0;
      referenceUpdate(adam, step, stepLr, members[k].wd, coef, p, g0[i], m,
                      v);
      refP.push_back(p);
      refM.push_back(m);
      gotP.push_back(pOut[i]);
      gotM.push_back(mOut[i]);
      if (adam) {
        refV.push_back(v);
        gotV.push_back((*vOut)[i]);
      }
    }
    worst = std::max({worst, relDiff(gotP, refP), relDiff(gotM, refM),
                      adam ? relDiff(gotV, refV) : 0.0});
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "worst rel %.2e (tol 1e-5)", worst);
  ck.check(kernel + " grouped vs fp64", worst <= 1e-5, buf);
  ck.check(kernel + " ZeRO: outside the range untouched", outsideKept,
           "masters and moments outside [zero_begin, zero_end)");
  // Each shadow is the bf16 rounding of its master, updated or not.
  bool shadowsMatch = true;
  for (size_t s = 0; s < shadowed.size(); ++s) {
    const std::vector<float> &sh = fused[read.size() + s];
    size_t pos = 0;
    while (read[pos] != shadowed[s])
      ++pos;
    for (size_t i = 0; i < sh.size(); ++i)
      shadowsMatch &= sh[i] == bf16ToFloat(floatToBf16(fused[pos][i]));
  }
  ck.check(kernel + " grouped shadows = bf16(master)", shadowsMatch,
           std::to_string(shadowed.size()) + " shadows");
  static std::vector<std::unique_ptr<MiniProgram>> keep;
  keep.push_back(std::move(mp));
}

/// MAPP_CUDA_FUSE words: the new ones parse, an unknown one is an error
/// naming it.
void switchesCase(Checker &ck) {
  using mapp::rt::cuda::FusionSwitches;
  setenv("MAPP_CUDA_FUSE", "adam", 1);
  FusionSwitches on = FusionSwitches::fromEnv();
  ck.check("MAPP_CUDA_FUSE=adam", on.adam && !on.sgd && !on.gelu,
           "only the adamw groups");
  setenv("MAPP_CUDA_FUSE", "adam,bogus", 1);
  std::string err;
  try {
    FusionSwitches::fromEnv();
  } catch (const Error &e) {
    err = e.what();
  }
  ck.check("MAPP_CUDA_FUSE unknown word", err.find("'bogus'") != std::string::npos,
           err.empty() ? "no error" : err);
}

} // namespace

FusionTally mapp::test::runFusionCases(Backend &gpu) {
  Checker ck;
  const char *saved = std::getenv("MAPP_CUDA_FUSE");
  std::string restore = saved ? saved : "";
  try {
    linearGeluCase(gpu, ck, true);
    linearGeluCase(gpu, ck, false);
    wgradCase(gpu, ck);
    expertWgradCase(gpu, ck);
    linearAddCase(gpu, ck, true, false);
    linearAddCase(gpu, ck, true, true);
    linearAddCase(gpu, ck, false, false);
    dgradGeluCase(gpu, ck);
    normGradAddCase(gpu, ck, 160);
    normGradAddCase(gpu, ck, 36);
    optimGroupCase(gpu, ck, "adamw");
    optimGroupCase(gpu, ck, "sgd");
    switchesCase(ck);
  } catch (const Error &e) {
    ck.check("fusion cases", false, e.what());
  }
  if (saved)
    setenv("MAPP_CUDA_FUSE", restore.c_str(), 1);
  else
    unsetenv("MAPP_CUDA_FUSE");
  // Leave no program bound: later kernel calls carry other attrs anyway,
  // but the fused roles must not outlive these programs.
  Program empty;
  gpu.bindProgram(empty, nullptr, nullptr);
  return ck.t;
}

//===- CudaFp8Test.cpp - the fp8 recipe on the device ----------------------===//
//
// docs/cuda-backend.md, "FP8". Checks, each against an independent
// reference:
//   conversion  the device's fp8 bytes of v·scale (quantize kernels,
//               straight, transposed and fused), decoded on the host from
//               the OCP bit layout, equal mapp::rt::fp8Round (the CPU
//               emulation) bit for bit, over random values, ties, the
//               subnormal range, saturation, ±inf and NaN; the recorded
//               amax equals amaxBits; the transposed copy is the straight
//               one transposed;
//   gemm        fp8_linear / fp8_matmul (input and weight gradient; fast
//               accumulation on and off; cuBLASLt and the tiled kernel;
//               fp32 and bf16 outputs) against a double-precision product
//               of the same quantized operands (so only the fp32
//               accumulation and the output rounding differ: 1e-5 / 4e-3
//               relative) and against the CPU backend's kernel;
//   update      fp8_update against fp8UpdateRow bit for bit (NaN, zero and
//               ordinary histories, margins).
// Exit 77 without a GPU; 1 on any failure.
//
//===----------------------------------------------------------------------===//
#include "Fp8.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Fp8.h"
#include "mapp/rt/Kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

std::mt19937_64 rng(20);
int gFailed = 0, gTotal = 0;

void report(const std::string &name, bool ok, const std::string &detail) {
  ++gTotal;
  if (!ok)
    ++gFailed;
  std::printf("%-44s %s %s\n", name.c_str(), ok ? "ok  " : "FAIL", detail.c_str());
}

/// The value of an fp8 byte, from the OCP OFP8 layouts (independent of
/// fp8Round): E4M3FN s.eeee.mmm, bias 7, S.1111.111 NaN, no infinities;
/// E5M2 s.eeeee.mm, bias 15, exponent 31: inf (m = 0) or NaN.
double decodeFp8(uint8_t b, Fp8Format f) {
  int s = b >> 7;
  int eb = f == Fp8Format::E4M3 ? 4 : 5, mb = 7 - eb;
  int bias = f == Fp8Format::E4M3 ? 7 : 15;
  int e = (b >> mb) & ((1 << eb) - 1), m = b & ((1 << mb) - 1);
  double v;
  if (f == Fp8Format::E4M3 && e == 15 && m == 7)
    v = NAN;
  else if (f == Fp8Format::E5M2 && e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = std::ldexp(double(m), 1 - bias - mb);
  else
    v = std::ldexp(double(m + (1 << mb)), e - bias - mb);
  return s ? -v : v;
}

template <typename T> T *dev(const std::vector<T> &h) {
  T *p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(h.size(), 1) * sizeof(T)) != cudaSuccess)
    fail("cudaMalloc");
  cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}
template <typename T> std::vector<T> host(const T *p, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

bool sameValue(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

/// Values that probe every rounding rule of `f` at scale s.
std::vector<float> probeValues(Fp8Format f, float s, int64_t n) {
  std::vector<float> v;
  float max = fp8Max(f);
  // Every representable magnitude, and the midpoints (ties) and their
  // neighbours, all divided by the scale.
  for (int b = 0; b < 128; ++b) {
    double x = decodeFp8(static_cast<uint8_t>(b), f);
    double y = decodeFp8(static_cast<uint8_t>(b + 1), f);
    if (!std::isfinite(x))
      continue;
    v.push_back(float(x) / s);
    if (std::isfinite(y) && y > x) {
      float mid = float((x + y) / 2);
      v.push_back(mid / s);
      v.push_back(std::nextafter(mid, 0.0f) / s);
      v.push_back(std::nextafter(mid, 1e30f) / s);
    }
  }
  for (float x : {max * 1.01f, max * 2, 1e30f, INFINITY, NAN, 1e-30f, 0.0f})
    v.push_back(x / s);
  size_t base = v.size();
  for (size_t i = 0; i < base; ++i)
    v.push_back(-v[i]);
  std::normal_distribution<float> nd(0, 1);
  std::uniform_real_distribution<float> ex(-20, 20);
  while (int64_t(v.size()) < n)
    v.push_back(nd(rng) * std::exp2(ex(rng)) / s);
  v.resize(n);
  return v;
}

void conversionCases(cudaStream_t st) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (float scale : {1.0f, 37.25f, 0.0078125f})
      for (int bf16 : {0, 1}) {
        const int64_t rows = 67, cols = 45, n = rows * cols;
        std::vector<float> v = probeValues(f, scale, n);
        std::vector<uint16_t> vb(n);
        if (bf16)
          for (int64_t i = 0; i < n; ++i) {
            vb[i] = floatToBf16(v[i]);
            v[i] = bf16ToFloat(vb[i]);
          }
        std::vector<float> meta = {scale, 0.0f};
        float *dm = dev(meta), *dd = dev(std::vector<float>(1, 0.0f));
        void *dv = bf16 ? static_cast<void *>(dev(vb)) : static_cast<void *>(dev(v));
        uint8_t *qs = dev(std::vector<uint8_t>(n, 0xAA));
        uint8_t *qt = dev(std::vector<uint8_t>(n, 0xAA));
        uint8_t *q2 = dev(std::vector<uint8_t>(n, 0xAA));
        cuda::fp8Quantize(dv, bf16, rows, cols, f, dm, qs, nullptr, dd, st);
        cuda::fp8Quantize(dv, bf16, rows, cols, f, dm, q2, qt, nullptr, st); // fused
        cudaStreamSynchronize(st);
        auto hs = host(qs, n), ht = host(qt, n), h2 = host(q2, n);
        auto hm = host(dm, 2);
        auto hd = host(dd, 1);
        int64_t bad = 0, badT = 0;
        std::string first;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            int64_t i = r * cols + c;
            double want = fp8Round(v[i] * scale, f);
            if (!sameValue(decodeFp8(hs[i], f), want)) {
              if (!bad++) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "v=%a v*s=%a: device %a, emulation %a",
                              v[i], v[i] * scale, decodeFp8(hs[i], f), want);
                first = buf;
              }
            }
            if (ht[c * rows + r] != hs[i] || h2[i] != hs[i])
              ++badT;
          }
        bool amaxOk = absBits(hm[1]) == amaxBits(v.data(), n);
        bool descaleOk = hd[0] == 1.0f / scale;
        char name[96];
        std::snprintf(name, sizeof name, "conversion %s scale %g %s",
                      f == Fp8Format::E4M3 ? "e4m3" : "e5m2", scale,
                      bf16 ? "bf16" : "f32");
        char detail[320];
        std::snprintf(detail, sizeof detail,
                      "%lld/%lld differ, transposed/fused %lld, amax %s, descale %s %s",
                      (long long)bad, (long long)n, (long long)badT,
                      amaxOk ? "ok" : "WRONG", descaleOk ? "ok" : "WRONG",
                      first.c_str());
        report(name, !bad && !badT && amaxOk && descaleOk, detail);
        cudaFree(dm);
        cudaFree(dd);
        cudaFree(dv);
        cudaFree(qs);
        cudaFree(qt);
        cudaFree(q2);
      }
}

struct GemmCase {
  std::string name;
  std::string kernel; // fp8_linear | fp8_matmul
  bool ta = false, bias = false, fast = false, outBf16 = false;
  int64_t M, N, K;  // the product's dims
  std::string fa, fb;
  int ra, rb;
};

double normRel(const std::vector<float> &out, const std::vector<double> &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = out[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void gemmCase(const GemmCase &g, Backend &cpu, Backend &gpu) {
  const int64_t H = 4, rl = 1 + H;
  int64_t M = g.M, N = g.N, K = g.K;
  // Operand shapes as the kernels take them.
  Shape sa, sb;
  if (g.kernel == "fp8_linear") {
    sa = {M, K};
    sb = {N, K};
  } else if (g.ta) {
    sa = {K, M};
    sb = {K, N};
  } else {
    sa = {M, K};
    sb = {K, N};
  }
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> A(M * K), B(N * K), bias(N);
  for (auto &x : A)
    x = nd(rng) * 3.0f;
  for (auto &x : B)
    x = nd(rng) * 0.02f;
  for (auto &x : bias)
    x = nd(rng);
  std::vector<float> meta(3 * rl, 0.0f);
  float scales[3] = {448.0f / 12.0f, 448.0f / 0.08f, 57344.0f / 20.0f};
  for (int r = 0; r < 3; ++r) {
    meta[r * rl] = scales[r];
    meta[r * rl + 1] = 0.5f; // h[0] before: amax keeps the max with it
  }
  Attrs attrs;
  attrs.setStr("fp8_a", g.fa);
  attrs.setStr("fp8_b", g.fb);
  attrs.setInt("meta_a", g.ra);
  attrs.setInt("meta_b", g.rb);
  if (g.fast)
    attrs.setInt("fast_accum", 1);
  if (g.ta)
    attrs.setInt("transpose_a", 1);
  Fp8Format fa, fb;
  parseFp8Format(g.fa, fa);
  parseFp8Format(g.fb, fb);
  // fp64 reference from the quantized operands: element (i, j) of
  // op(a)·op(b) with op(b) as [K, N].
  // Quantized once, as qa[i][k] and qb[j][k] (K contiguous for the loop).
  float sA = meta[g.ra * rl], sB = meta[g.rb * rl];
  std::vector<double> qa(M * K), qb(N * K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      qa[i * K + k] = fp8Round((g.ta ? A[k * M + i] : A[i * K + k]) * sA, fa);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t k = 0; k < K; ++k)
      qb[j * K + k] =
          fp8Round((g.kernel == "fp8_linear" ? B[j * K + k] : B[k * N + j]) * sB, fb);
  double descale = double(1.0f / sA) * double(1.0f / sB);
  std::vector<double> ref(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += qa[i * K + k] * qb[j * K + k];
      ref[i * N + j] = acc * descale + (g.bias ? bias[j] : 0.0);
    }
  // The CPU backend's emulation.
  std::vector<float> cpuMeta = meta, cpuOut(M * N);
  std::vector<Tensor> ci = {{A.data(), {DType::F32, sa}}, {B.data(), {DType::F32, sb}}};
  if (g.bias)
    ci.push_back({bias.data(), {DType::F32, {N}}});
  ci.push_back({cpuMeta.data(), {DType::F32, {3 * rl}}});
  Tensor co{cpuOut.data(), {DType::F32, {M, N}}};
  KernelContext cctx;
  cctx.pool = &cpu.pool();
  cpu.lookup(g.kernel)({attrs, ci.data(), (int)ci.size(), &co, 1, cctx});
  // The device.
  float *dA = dev(A), *dB = dev(B), *dBias = dev(bias), *dMeta = dev(meta);
  void *dOut = nullptr;
  cudaMalloc(&dOut, M * N * 4);
  cudaMemset(dOut, 0xFF, M * N * 4);
  cudaDeviceSynchronize(); // the backend's stream is non-blocking: no implicit order with this memset
  std::vector<Tensor> gi = {{dA, {DType::F32, sa}}, {dB, {DType::F32, sb}}};
  if (g.bias)
    gi.push_back({dBias, {DType::F32, {N}}});
  gi.push_back({dMeta, {DType::F32, {3 * rl}}});
  Tensor go{dOut, {g.outBf16 ? DType::BF16 : DType::F32, {M, N}}};
  KernelContext gctx;
  gctx.pool = &gpu.pool();
  gctx.backend = &gpu;
  std::string err;
  std::vector<float> out(M * N);
  const int64_t fallbacksBefore = cuda::fp8GemmFallbacks();
  try {
    gpu.lookup(g.kernel)({attrs, gi.data(), (int)gi.size(), &go, 1, gctx});
    gpu.synchronize();
    if (g.outBf16) {
      auto hb = host(static_cast<uint16_t *>(dOut), M * N);
      for (int64_t i = 0; i < M * N; ++i)
        out[i] = bf16ToFloat(hb[i]);
    } else {
      out = host(static_cast<float *>(dOut), M * N);
    }
  } catch (const std::exception &e) {
    err = e.what();
  }
  auto hm = host(dMeta, 3 * rl);
  double e64 = normRel(out, ref);
  std::vector<double> cpuRef(cpuOut.begin(), cpuOut.end());
  double eCpu = normRel(out, cpuRef), cpu64 = normRel(cpuOut, ref);
  // Which path ran decides the fp32 bar: Hopper's fp8 tensor cores add
  // their products with fewer accumulator bits than an fp32 FMA (measured
  // 0.8-1.3e-4 relative against fp64 on the H200, fast accumulation off),
  // where the tiled kernel and the CPU accumulate in fp32 (~5e-8).
  bool fellBack = cuda::fp8GemmFallbacks() != fallbacksBefore;
  bool forced = std::getenv("MAPP_CUDA_FP8_GEMM") != nullptr;
  bool onLt = !fellBack && !forced;
  double tol = g.outBf16 ? 4e-3 : onLt ? 5e-4 : 1e-5;
  // amax rows: the max of 0.5 and the operand's amax (CPU and device agree).
  bool metaOk = true;
  for (int r = 0; r < 3; ++r)
    metaOk &= absBits(hm[r * rl + 1]) == absBits(cpuMeta[r * rl + 1]) &&
              hm[r * rl] == meta[r * rl];
  uint32_t wantA = std::max(absBits(0.5f), amaxBits(A.data(), A.size()));
  metaOk &= absBits(hm[g.ra * rl + 1]) == wantA;
  // Shapes cuBLASLt takes must run on it: a silent tiled fallback is ~50×
  // slower (the 124M model's first fp8 bench). Forced tiled runs don't count.
  bool wantFallback = !forced && (M % 16 || N % 16 || K % 16);
  char detail[320];
  std::snprintf(detail, sizeof detail,
                "vs fp64 %.2e, vs cpu %.2e (cpu vs fp64 %.2e, tol %.0e), meta %s, %s%s %s",
                e64, eCpu, cpu64, tol, metaOk ? "ok" : "WRONG",
                onLt ? "cuBLASLt" : "tiled",
                fellBack == wantFallback ? "" : " (WRONG path)", err.c_str());
  report(g.name, err.empty() && e64 < tol && eCpu < 2 * tol && cpu64 < 1e-5 &&
                     metaOk && fellBack == wantFallback,
         detail);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dBias);
  cudaFree(dMeta);
  cudaFree(dOut);
}

void updateCases(Backend &cpu, Backend &gpu) {
  for (int64_t H : {1, 4, 16})
    for (int64_t margin : {0, 2}) {
      const int64_t rl = 1 + H;
      std::vector<float> meta(3 * rl);
      std::uniform_real_distribution<float> u(0, 100);
      for (auto &x : meta)
        x = u(rng);
      meta[rl + 1] = NAN; // row 1: a NaN amax keeps the scale
      for (int64_t i = 0; i < H; ++i)
        meta[2 * rl + 1 + i] = 0.0f; // row 2: all zero keeps it too
      Attrs attrs;
      attrs.setStr("format_x", "e4m3");
      attrs.setStr("format_w", "e4m3");
      attrs.setStr("format_dy", "e5m2");
      attrs.setInt("history", H);
      attrs.setInt("margin", margin);
      std::vector<float> want = meta;
      Tensor ct{want.data(), {DType::F32, {3 * rl}}};
      KernelContext cctx;
      cctx.pool = &cpu.pool();
      cpu.lookup("fp8_update")({attrs, &ct, 1, nullptr, 0, cctx});
      // The rule itself, restated.
      std::vector<float> rule = meta;
      fp8UpdateRow(rule.data(), H, margin, Fp8Format::E4M3);
      fp8UpdateRow(rule.data() + rl, H, margin, Fp8Format::E4M3);
      fp8UpdateRow(rule.data() + 2 * rl, H, margin, Fp8Format::E5M2);
      float *dm = dev(meta);
      Tensor gt{dm, {DType::F32, {3 * rl}}};
      KernelContext gctx;
      gctx.pool = &gpu.pool();
      gctx.backend = &gpu;
      gpu.lookup("fp8_update")({attrs, &gt, 1, nullptr, 0, gctx});
      gpu.synchronize();
      auto got = host(dm, 3 * rl);
      bool ok = true;
      for (int64_t i = 0; i < 3 * rl; ++i)
        ok &= absBits(got[i]) == absBits(want[i]) && absBits(rule[i]) == absBits(want[i]);
      float s0 = (448.0f / fromBits(amaxBits(meta.data() + 1, H))) / std::ldexp(1.0f, margin);
      ok &= got[0] == s0 && got[rl] == meta[rl] && got[2 * rl] == meta[2 * rl] &&
            got[1] == 0.0f && (H == 1 || got[2] == meta[1]);
      char name[64];
      std::snprintf(name, sizeof name, "fp8_update history %lld margin %lld",
                    (long long)H, (long long)margin);
      report(name, ok, ok ? "" : "device, CPU and the rule differ");
      cudaFree(dm);
    }
}

} // namespace

int main(int argc, char **argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  std::string only = argc > 1 ? argv[1] : "";
  std::unique_ptr<Backend> cpu = createCpuBackend(4);
  std::unique_ptr<Backend> gpu = createCudaBackend(0);
  try {
    cudaStream_t st;
    cudaStreamCreate(&st);
    if (only.empty() || only == "conversion")
      conversionCases(st);
    if (only.empty() || only == "gemm") {
      std::vector<GemmCase> cases = {
          // GPT-shaped: 256 tokens, hidden 128, fc 512 (cuBLASLt path).
          {"fp8_linear 256x512x128 bias fast bf16", "fp8_linear", false, true, true, true, 256, 512, 128, "e4m3", "e4m3", 0, 1},
          {"fp8_linear 256x128x512 f32 out", "fp8_linear", false, false, false, false, 256, 128, 512, "e4m3", "e4m3", 0, 1},
          {"fp8_matmul dgrad 256x128x512 e5m2", "fp8_matmul", false, false, false, true, 256, 128, 512, "e5m2", "e4m3", 2, 1},
          {"fp8_matmul wgrad 512x128x256 e5m2 f32", "fp8_matmul", true, false, false, false, 512, 128, 256, "e5m2", "e4m3", 2, 0},
          {"fp8_matmul wgrad 128x512x256 e4m3 f32", "fp8_matmul", true, false, false, false, 128, 512, 256, "e4m3", "e4m3", 2, 0},
          // Large enough (M·N·K ≥ 2^30) for the timed algorithm choice.
          {"fp8_linear 1024x1024x1024 bias fast bf16 (tuned)", "fp8_linear", false, true, true, true, 1024, 1024, 1024, "e4m3", "e4m3", 0, 1},
          {"fp8_matmul dgrad 1024x1024x1024 e5m2 bf16 (tuned)", "fp8_matmul", false, false, false, true, 1024, 1024, 1024, "e5m2", "e4m3", 2, 1},
          {"fp8_matmul wgrad 1024x1024x1024 e5m2 f32 (tuned)", "fp8_matmul", true, false, false, false, 1024, 1024, 1024, "e5m2", "e4m3", 2, 0},
          // Not multiples of 16: the tiled kernel.
          {"fp8_linear 37x50x70 bias tiled", "fp8_linear", false, true, false, false, 37, 50, 70, "e4m3", "e4m3", 0, 1},
          {"fp8_matmul dgrad 33x20x48 tiled", "fp8_matmul", false, false, false, true, 33, 20, 48, "e5m2", "e4m3", 2, 1},
          {"fp8_matmul wgrad 24x40x55 tiled", "fp8_matmul", true, false, false, false, 24, 40, 55, "e5m2", "e4m3", 2, 0},
      };
      for (const GemmCase &g : cases)
        gemmCase(g, *cpu, *gpu);
      if (!std::getenv("MAPP_CUDA_FP8_GEMM"))
        std::printf("(run again with MAPP_CUDA_FP8_GEMM=tiled for the tiled kernel on every shape)\n");
    }
    if (only.empty() || only == "update")
      updateCases(*cpu, *gpu);
  } catch (const std::exception &e) {
    std::printf("FAIL %s\n", e.what());
    ++gFailed;
    ++gTotal;
  }
  std::printf("cuda fp8 check: %d/%d passed\n", gTotal - gFailed, gTotal);
  return gFailed ? 1 : 0;
}

//===- CudaDeterminismTest.cpp - run-to-run bit-identity of the reductions ===//
//
// The kernels whose sums used to be float atomics (docs/cuda-backend.md,
// "Determinism"), each called twice on the same inputs: the outputs must be
// byte-identical, and they are checked against a double sum on the host.
//   embedding_grad — ids from a tiny range, so thousands of rows share each
//     table row (atomics in any order would round differently);
//   global_norm and Backend::sumSquares — many tensors, many blocks each;
//   attention_grad under MAPP_CUDA_DETERMINISTIC=1 — the flash backward
//     with the separate dQ pass (head dims 64 and 128, causal and full, GQA,
//     a length that is not a multiple of the 64-row tile); its values are
//     checked against the fp64 loops by CudaKernelTest's "det" cases.
// Part of mapp-cuda-kernel-test (main in CudaKernelTest.cpp).
//
//===----------------------------------------------------------------------===//
#include "CudaDeterminismTest.h"

#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace mapp::rt;

namespace {

std::mt19937_64 gRng(2026);

/// A device tensor that frees itself.
struct Dev {
  Tensor t;
  size_t bytes = 0;
  Dev(DType d, Shape s) {
    t.type = {d, std::move(s)};
    bytes = std::max<int64_t>(t.numel(), 1) * (d == DType::BF16 ? 2 : 4);
    if (cudaMalloc(&t.data, bytes) != cudaSuccess)
      fail("cudaMalloc of ", bytes, " bytes failed");
  }
  ~Dev() { cudaFree(t.data); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
  std::vector<unsigned char> bytesBack() const {
    std::vector<unsigned char> h(bytes);
    cudaMemcpy(h.data(), t.data, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
  std::vector<float> floatsBack() const {
    std::vector<unsigned char> b = bytesBack();
    std::vector<float> f(t.numel());
    if (t.type.dtype == DType::BF16)
      for (size_t i = 0; i < f.size(); ++i) {
        uint16_t x;
        std::memcpy(&x, b.data() + 2 * i, 2);
        f[i] = bf16ToFloat(x);
      }
    else
      std::memcpy(f.data(), b.data(), f.size() * 4);
    return f;
  }
};

/// Normal values (rounded to bf16 when the tensor is bf16), uploaded; the
/// host copy holds exactly what the device holds.
std::vector<float> fill(Dev &d) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> h(d.t.numel());
  for (float &x : h)
    x = nd(gRng);
  if (d.t.type.dtype == DType::BF16) {
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      b[i] = floatToBf16(h[i]);
      h[i] = bf16ToFloat(b[i]);
    }
    cudaMemcpy(d.t.data, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  } else {
    cudaMemcpy(d.t.data, h.data(), h.size() * 4, cudaMemcpyHostToDevice);
  }
  return h;
}

void call(Backend &gpu, const char *kernel, const Attrs &at,
          std::vector<Tensor> in, std::vector<Tensor> out) {
  KernelContext ctx;
  ctx.backend = &gpu;
  ctx.pool = &gpu.pool();
  gpu.lookup(kernel)({at, in.data(), (int)in.size(), out.data(), (int)out.size(), ctx});
  gpu.synchronize();
}

double relErr(const std::vector<float> &got, const std::vector<double> &want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = got[i] - want[i];
    num += std::isfinite(got[i]) ? d * d : INFINITY;
    den += want[i] * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

bool report(const std::string &name, bool same, double err, double tol) {
  bool ok = same && err <= tol;
  std::printf("%-5s %-34s %s  %s, rel %.2e (tol %.0e)\n", "det", name.c_str(),
              ok ? "ok  " : "FAIL", same ? "two calls identical" : "two calls DIFFER",
              err, tol);
  return ok;
}

/// 4096 ids in [0, 3) into a 5-row table: ~1365 rows summed into each of
/// three, none into the last two (which must come back zero).
bool embeddingGradCase(Backend &gpu) {
  const int64_t n = 4096, h = 96, V = 5;
  Dev dy(DType::F32, {2, n / 2, h}), ids(DType::I32, {2, n / 2}), out(DType::F32, {V, h});
  std::vector<float> hdy = fill(dy);
  std::vector<int32_t> hid(n);
  std::uniform_int_distribution<int> pick(0, 2);
  for (int32_t &x : hid)
    x = pick(gRng);
  cudaMemcpy(ids.t.data, hid.data(), n * 4, cudaMemcpyHostToDevice);
  std::vector<double> want(V * h, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < h; ++c)
      want[hid[r] * h + c] += hdy[r * h + c];
  call(gpu, "embedding_grad", {}, {dy.t, ids.t}, {out.t});
  std::vector<unsigned char> first = out.bytesBack();
  cudaMemset(out.t.data, 0xFF, out.bytes); // an unwritten element reads NaN
  call(gpu, "embedding_grad", {}, {dy.t, ids.t}, {out.t});
  return report("embedding_grad 4096 ids in 3 rows", first == out.bytesBack(),
                relErr(out.floatsBack(), want), 1e-5);
}

/// global_norm over 40 tensors (sizes across block boundaries, one bf16) and
/// sumSquares over the same fp32 list.
bool normCases(Backend &gpu) {
  std::vector<std::unique_ptr<Dev>> ts;
  std::vector<Tensor> in, f32s;
  double want = 0, wantF32 = 0;
  for (int i = 0; i < 40; ++i) {
    int64_t n = i % 7 == 0 ? (int64_t(1) << 20) + i : 255 * i + 1;
    DType d = i == 5 ? DType::BF16 : DType::F32;
    ts.push_back(std::make_unique<Dev>(d, Shape{n}));
    for (float x : fill(*ts.back())) {
      want += double(x) * x;
      if (d == DType::F32)
        wantF32 += double(x) * x;
    }
    in.push_back(ts.back()->t);
    if (d == DType::F32)
      f32s.push_back(ts.back()->t);
  }
  Dev out(DType::F32, {});
  call(gpu, "global_norm", {}, in, {out.t});
  std::vector<unsigned char> first = out.bytesBack();
  call(gpu, "global_norm", {}, in, {out.t});
  bool ok = report("global_norm 40 tensors", first == out.bytesBack(),
                   relErr(out.floatsBack(), {std::sqrt(want)}), 1e-6);
  double a = gpu.sumSquares(f32s), b = gpu.sumSquares(f32s);
  ok &= report("sumSquares 34 tensors", std::memcmp(&a, &b, sizeof a) == 0,
               std::fabs(a - wantF32) / wantF32, 1e-9);
  return ok;
}

/// attention_grad twice on the deterministic backend: dq, dk, dv identical.
bool attentionCase(Backend &det, const char *name, int64_t B, int64_t T,
                   int64_t heads, int64_t kvHeads, int64_t D, bool causal) {
  int64_t H = heads * D, Hk = kvHeads * D;
  Dev dout(DType::BF16, {B, T, H}), q(DType::BF16, {B, T, H}),
      k(DType::BF16, {B, T, Hk}), v(DType::BF16, {B, T, Hk});
  Dev dq(DType::F32, {B, T, H}), dk(DType::F32, {B, T, Hk}), dv(DType::F32, {B, T, Hk});
  for (Dev *d : {&dout, &q, &k, &v})
    fill(*d);
  Attrs at;
  at.setInt("heads", heads);
  at.setFloat("scale", 1.0 / std::sqrt(double(D)));
  if (causal)
    at.setInt("causal", 1);
  std::vector<Tensor> in = {dout.t, q.t, k.t, v.t}, out = {dq.t, dk.t, dv.t};
  call(det, "attention_grad", at, in, out);
  std::vector<unsigned char> a = dq.bytesBack(), b = dk.bytesBack(), c = dv.bytesBack();
  for (Dev *d : {&dq, &dk, &dv})
    cudaMemset(d->t.data, 0xFF, d->bytes);
  call(det, "attention_grad", at, in, out);
  bool same = a == dq.bytesBack() && b == dk.bytesBack() && c == dv.bytesBack();
  bool finite = true;
  for (Dev *d : {&dq, &dk, &dv})
    for (float x : d->floatsBack())
      finite &= std::isfinite(x);
  return report(name, same && finite, finite ? 0.0 : INFINITY, 0);
}

} // namespace

mapp::test::DeterminismTally mapp::test::runDeterminismCases(Backend &det) {
  DeterminismTally t;
  auto one = [&](auto &&f) {
    ++t.total;
    try {
      t.failed += !f();
    } catch (const std::exception &e) {
      std::printf("det   FAIL %s\n", e.what());
      ++t.failed;
    }
  };
  // The default backend keeps float atomics here (verified, fastest): the
  // fixed-order forms run under MAPP_CUDA_DETERMINISTIC=1 only.
  one([&] { return embeddingGradCase(det); });
  one([&] { return normCases(det); });
  one([&] { return attentionCase(det, "attention_grad D64 causal", 2, 200, 2, 2, 64, true); });
  one([&] { return attentionCase(det, "attention_grad D128 full", 1, 130, 2, 2, 128, false); });
  one([&] { return attentionCase(det, "attention_grad GQA 8/2 D64 causal", 1, 192, 8, 2, 64, true); });
  one([&] { return attentionCase(det, "attention_grad GQA 4/2 D128 causal", 1, 300, 4, 2, 128, true); });
  return t;
}

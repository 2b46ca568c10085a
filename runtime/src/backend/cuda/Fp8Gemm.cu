//===- Fp8Gemm.cu - fp8_linear / fp8_matmul / fp8_update on CUDA ----------===//
//
// cuBLASLt fp8 GEMMs on sm_90 (docs/cuda-backend.md, "FP8"). Hopper's fp8
// kernels take only the "TN" layout: both operands K-contiguous. With
// row-major c[M,N] = a[M,K]·b[N,K]ᵀ issued as its column-major transpose
// cᵀ = bᵀ... (Lt's A is our b with op T, Lt's B our a with op N) that is
// exactly "both operands row-major with K last", so each kernel quantizes
// its operands into that layout:
//   fp8_linear   y = x·wᵀ         x [M,K] straight, w [N,K] straight
//   fp8_matmul   dx = dy·w        dy [M,K] straight, w [K,N] transposed
//   (transpose_a) dw = dyᵀ·x      dy [K,M] transposed, x [K,N] transposed
// (cast and transpose in one kernel, Fp8.cu). The descales 1/scale are
// device pointers (A/B_SCALE_POINTER), written by the quantize kernels, so
// no step waits for the host. Output: the result's storage type (bf16
// activations, fp32 weight-gradient contributions), fp32 accumulation;
// CUBLASLT_MATMUL_DESC_FAST_ACCUM only for the forward (fast_accum), as in
// Transformer Engine. Descriptors and the timed algorithm choice are cached
// per shape like Gemm.cu's. Shapes the fp8 kernels do not take (a dimension
// not a multiple of 16) and MAPP_CUDA_FP8_GEMM=tiled run the tiled kernel
// on the same quantized operands. A fallback nobody asked for costs ~50× in
// GEMM time, so it is said on stderr once per shape, with cuBLASLt's reason.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "Fp8.h"
#include "LtSetup.cuh"
#include "LtTune.h"

#include <cublasLt.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

struct Fp8Key {
  const CudaBackend *owner;
  int64_t m, n, k; // Lt's (column-major) dims
  int fa, fb, dBf16, fast;
  int scaled; // descales as Lt's A/B scale pointers, else applied after
  uint32_t align;
  bool operator<(const Fp8Key &o) const {
    return std::tie(owner, m, n, k, fa, fb, dBf16, fast, scaled, align) <
           std::tie(o.owner, o.m, o.n, o.k, o.fa, o.fb, o.dBf16, o.fast,
                    o.scaled, o.align);
  }
};

struct Fp8Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  bool ok = false, tuned = false;
  std::string rejected; // why the heuristic gave no algorithm
};

std::mutex gMutex;
std::map<Fp8Key, Fp8Plan> gPlans;

cudaDataType_t ltType(int e5m2) {
  return e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

std::atomic<int64_t> gFallbacks{0};

void noteFallback(int64_t M, int64_t N, int64_t K, const std::string &why) {
  ++gFallbacks;
  static std::mutex m;
  static std::set<std::tuple<int64_t, int64_t, int64_t>> said;
  std::lock_guard<std::mutex> lock(m);
  if (said.insert({M, N, K}).second)
    std::fprintf(stderr,
                 "mapp cuda: fp8 GEMM %lldx%lldx%lld (MxNxK) runs on the tiled "
                 "kernel, far slower than cuBLASLt: %s\n",
                 static_cast<long long>(M), static_cast<long long>(N),
                 static_cast<long long>(K), why.c_str());
}

void setScales(cublasLtMatmulDesc_t desc, const float *ltA, const float *ltB) {
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ltA, sizeof(ltA)));
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ltB, sizeof(ltB)));
}

/// `ltA` / `ltB`: the descale pointers of Lt's A and B, on the descriptor
/// before the heuristic runs when key.scaled.
Fp8Plan &planFor(CudaBackend &be, const Fp8Key &key, const float *ltA,
                 const float *ltB) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gPlans.find(key);
  if (it != gPlans.end())
    return it->second;
  Fp8Plan p;
  ltCreateMatmulDesc(&p.desc, CUBLAS_OP_T, CUBLAS_OP_N);
  int8_t fast = key.fast ? 1 : 0;
  MAPP_LT_CHECK(cublasLtMatmulDescSetAttribute(
      p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (key.scaled)
    setScales(p.desc, ltA, ltB);
  cudaDataType_t dt = key.dBf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Lt's A is k×m stored (op T), B k×n (op N), D m×n.
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.a, ltType(key.fa), key.k, key.m, key.k));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, ltType(key.fb), key.k, key.n, key.k));
  MAPP_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, key.m, key.n, key.m));
  LtHeuristic h = ltHeuristic(be, p.desc, p.a, p.b, p.d, key.align, 8);
  if (h.ok()) {
    p.algo = h.first;
    p.ok = true;
    p.candidates = h.runnable;
  } else {
    p.rejected = "cuBLASLt's heuristic gave no algorithm (status " +
                 std::to_string(static_cast<int>(h.status)) + ", A " +
                 (key.fa ? "e5m2" : "e4m3") + ", B " + (key.fb ? "e5m2" : "e4m3") +
                 ", D " + (key.dBf16 ? "bf16" : "f32") + ", alignment " +
                 std::to_string(key.align) + " B, workspace " +
                 std::to_string(be.ltWorkspaceBytes()) + " B)";
  }
  return gPlans.emplace(key, p).first->second;
}

uint32_t alignOf(std::initializer_list<const void *> ptrs) {
  uintptr_t bits = 256;
  for (const void *p : ptrs)
    bits |= reinterpret_cast<uintptr_t>(p);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

/// 0 auto, 1 tiled (MAPP_CUDA_FP8_GEMM=tiled), read once.
int gemmMode() {
  static int mode = [] {
    const char *e = std::getenv("MAPP_CUDA_FP8_GEMM");
    if (!e || !*e || std::strcmp(e, "lt") == 0)
      return 0;
    if (std::strcmp(e, "tiled") == 0)
      return 1;
    fail("MAPP_CUDA_FP8_GEMM must be lt or tiled, got '", e, "'");
  }();
  return mode;
}

bool deviceHasFp8(int device) {
  static std::mutex m;
  static std::map<int, bool> known;
  std::lock_guard<std::mutex> lock(m);
  auto it = known.find(device);
  if (it != known.end())
    return it->second;
  int major = 0, minor = 0;
  MAPP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MAPP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return known[device] = major * 10 + minor >= 89;
}

/// y = y·(da·db) + bias[col], either part optional (da null: no scale).
__global__ void epilogueRows(DView y, const float *da, const float *db,
                             const float *bias, int64_t rows, int64_t n) {
  const float scale = da ? *da * *db : 1.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = da ? y.ld(i) * scale : y.ld(i);
    y.st(i, bias ? v + bias[i % n] : v);
  }
}

/// Set once cuBLASLt refuses every algorithm of a scaled fp8 product (as
/// cuBLAS 13.1 on the H200 did, status 15 at run time after the heuristic
/// offered 8, while the B scale sat 4 bytes after the A scale): from then on
/// the products run unscaled and epilogueRows applies the descales.
std::atomic<bool> gScalesRefused{false};

/// The two descales of a product sit 256 bytes apart (each at the alignment
/// of a fresh allocation, whatever cuBLASLt asks of scale pointers).
constexpr int64_t kDescaleStride = 64;

/// One product on cuBLASLt: c = op(Lt A = b)·op(Lt B = a) with fp32
/// accumulation, scaled by the descale pointers when key.scaled. False, with
/// `reason`, when cuBLASLt won't take it.
bool runLt(CudaBackend &be, const Fp8Key &key, const uint8_t *a,
           const uint8_t *b, const float *da, const float *db, DView c,
           std::string &reason) {
  cudaStream_t s = be.stream();
  Fp8Plan *p = &planFor(be, key, db, da); // Lt's A is our b
  if (!p->ok) {
    reason = p->rejected;
    return false;
  }
  if (key.scaled)
    setScales(p->desc, db, da);
  float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t &algo) {
    return cublasLtMatmul(be.lt(), p->desc, &alpha, b, p->a, a, p->b, &beta,
                          c.p, p->d, c.p, p->d, &algo, be.ltWorkspace(),
                          be.ltWorkspaceBytes(), s);
  };
  if (!p->tuned && worthTuning(be, p->candidates.size(), key.m * key.n * key.k)) {
    int best = fastestAlgo(s, p->candidates, run);
    if (best >= 0)
      p->algo = p->candidates[best];
    p->tuned = true;
  }
  cublasStatus_t st = run(p->algo);
  // The heuristic's first choice can still be refused at run time: the next
  // candidates before giving up, and the one that ran is kept.
  for (size_t i = 0; st != CUBLAS_STATUS_SUCCESS && i < p->candidates.size(); ++i)
    if ((st = run(p->candidates[i])) == CUBLAS_STATUS_SUCCESS)
      p->algo = p->candidates[i];
  if (st == CUBLAS_STATUS_SUCCESS)
    return true;
  reason = "cublasLtMatmul refused all " + std::to_string(p->candidates.size()) +
           " of the heuristic's algorithms (last status " +
           std::to_string(static_cast<int>(st)) + ")";
  p->ok = false; // not asked again every call
  p->rejected = reason;
  return false;
}

} // namespace

bool cuda::fp8Gemm(CudaBackend &be, const uint8_t *a, Fp8Format fa,
                   const uint8_t *b, Fp8Format fb, const float *da,
                   const float *db, void *cp, bool cBf16, const float *bias,
                   int64_t M, int64_t N, int64_t K, bool fastAccum) {
  cudaStream_t s = be.stream();
  DView c{cp, cBf16 ? 1 : 0};
  if (M == 0 || N == 0)
    return false;
  int dev = 0;
  MAPP_CUDA_CHECK(cudaGetDevice(&dev));
  const char *why = gemmMode() != 0          ? nullptr // asked for
                    : !deviceHasFp8(dev)     ? "the device is below sm_89"
                    : K == 0                 ? nullptr
                    : M % 16 || N % 16 || K % 16
                        ? "cuBLASLt's fp8 kernels need M, N and K multiples of 16"
                    : fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2
                        ? "cuBLASLt has no e5m2 x e5m2 kernel"
                        : "";
  std::string reason = why ? why : "";
  bool ran = false;
  if (why && !*why) {
    Fp8Key key{};
    key.owner = &be;
    key.m = N;
    key.n = M;
    key.k = K;
    key.fa = fb == Fp8Format::E5M2; // Lt's A is our b
    key.fb = fa == Fp8Format::E5M2;
    key.dBf16 = c.bf16;
    key.fast = fastAccum;
    key.align = alignOf({a, b, c.p});
    key.scaled = !gScalesRefused.load();
    ran = runLt(be, key, a, b, da, db, c, reason);
    if (!ran && key.scaled && !gScalesRefused.exchange(true)) {
      std::fprintf(stderr, "mapp cuda: cuBLASLt refused a scaled fp8 GEMM (%s); "
                           "fp8 GEMMs now run unscaled with the descales "
                           "applied after\n", reason.c_str());
      key.scaled = 0;
      ran = runLt(be, key, a, b, da, db, c, reason);
    }
    if (ran && (!key.scaled || bias)) {
      epilogueRows<<<gridFor(M * N, 256), 256, 0, s>>>(
          c, key.scaled ? nullptr : da, db, bias, M, N);
      MAPP_CUDA_LAUNCHED();
    }
  }
  if (!ran) {
    if (!reason.empty())
      noteFallback(M, N, K, reason);
    fp8GemmTiled(a, fa, b, fb, da, db, cp, cBf16, bias, M, N, K, s);
  }
  return ran;
}

int64_t cuda::fp8GemmFallbacks() { return gFallbacks.load(); }

namespace {

struct Operand {
  Fp8Format fmt;
  float *meta; // the operand's meta row
};

Operand operandOf(const KernelArgs &a, const Tensor &metaT, const char *fmtKey,
                  const char *rowKey) {
  Operand o;
  if (!parseFp8Format(a.attrs.getStr(fmtKey, ""), o.fmt))
    fail("fp8 GEMM: bad ", fmtKey);
  int64_t row = a.attrs.getInt(rowKey, -1);
  o.meta = static_cast<float *>(metaT.data) + row * (metaT.numel() / 3);
  return o;
}

} // namespace

void cuda::fp8_linear(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  const Tensor &x = a.in[0], &w = a.in[1], &metaT = a.in[a.numIn - 1];
  if (isBf16(metaT))
    fail("fp8_linear: the meta must be stored fp32");
  const float *bias = nullptr;
  if (a.numIn == 4) {
    if (isBf16(a.in[2]))
      fail("fp8_linear: the CUDA backend expects an fp32 bias");
    bias = a.in[2].f32();
  }
  int64_t k = x.dim(-1), n = w.dim(0), m = n ? a.out[0].numel() / n : 0;
  Operand ox = operandOf(a, metaT, "fp8_a", "meta_a");
  Operand ow = operandOf(a, metaT, "fp8_b", "meta_b");
  auto *qx = static_cast<uint8_t *>(be.scratch(m * k + 256, 0));
  auto *qw = static_cast<uint8_t *>(be.scratch(n * k + 256, 3));
  auto *descales = static_cast<float *>(be.scratch(2 * kDescaleStride * 4, 1));
  fp8Quantize(x.data, isBf16(x), m, k, ox.fmt, ox.meta, qx, nullptr, descales, s);
  fp8Quantize(w.data, isBf16(w), n, k, ow.fmt, ow.meta, qw, nullptr, descales + kDescaleStride, s);
  if (k == 0) {
    fillZero(view(a.out[0]), a.out[0].numel(), s);
    if (bias)
      fp8GemmTiled(qx, ox.fmt, qw, ow.fmt, descales, descales + kDescaleStride,
                   a.out[0].data, isBf16(a.out[0]), bias, m, n, 0, s);
    return;
  }
  fp8Gemm(be, qx, ox.fmt, qw, ow.fmt, descales, descales + kDescaleStride, a.out[0].data,
          isBf16(a.out[0]), bias, m, n, k, a.attrs.flag("fast_accum"));
}

void cuda::fp8_matmul(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  cudaStream_t s = be.stream();
  const Tensor &A = a.in[0], &B = a.in[1], &metaT = a.in[2];
  if (isBf16(metaT))
    fail("fp8_matmul: the meta must be stored fp32");
  bool ta = a.attrs.flag("transpose_a");
  int64_t k = B.dim(0), n = B.dim(1);
  int64_t m = ta ? A.dim(1) : (k ? A.numel() / k : 0);
  Operand oa = operandOf(a, metaT, "fp8_a", "meta_a");
  Operand ob = operandOf(a, metaT, "fp8_b", "meta_b");
  auto *qa = static_cast<uint8_t *>(be.scratch(m * k + 256, 0));
  auto *qb = static_cast<uint8_t *>(be.scratch(n * k + 256, 3));
  auto *descales = static_cast<float *>(be.scratch(2 * kDescaleStride * 4, 1));
  // Into the TN layout: a as [M,K], b as [N,K] (b is [K,N]: transposed).
  if (ta)
    fp8Quantize(A.data, isBf16(A), k, m, oa.fmt, oa.meta, nullptr, qa, descales, s);
  else
    fp8Quantize(A.data, isBf16(A), m, k, oa.fmt, oa.meta, qa, nullptr, descales, s);
  fp8Quantize(B.data, isBf16(B), k, n, ob.fmt, ob.meta, nullptr, qb, descales + kDescaleStride, s);
  if (k == 0) {
    fillZero(view(a.out[0]), a.out[0].numel(), s);
    return;
  }
  fp8Gemm(be, qa, oa.fmt, qb, ob.fmt, descales, descales + kDescaleStride, a.out[0].data,
          isBf16(a.out[0]), nullptr, m, n, k, a.attrs.flag("fast_accum"));
}

void cuda::fp8_update(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &metaT = a.in[0];
  if (isBf16(metaT))
    fail("fp8_update: the meta must be stored fp32");
  Fp8Format f[3];
  const char *keys[3] = {"format_x", "format_w", "format_dy"};
  for (int r = 0; r < 3; ++r)
    if (!parseFp8Format(a.attrs.getStr(keys[r], ""), f[r]))
      fail("fp8_update: bad ", keys[r]);
  fp8UpdateMeta(static_cast<float *>(metaT.data), a.attrs.getInt("history", 0),
                a.attrs.getInt("margin", 0), f, be.stream());
}

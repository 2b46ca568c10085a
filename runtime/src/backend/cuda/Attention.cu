//===- Attention.cu - fused causal attention and its gradient -------------===//
//
// Flash-style: probabilities are never stored. The forward keeps, per
// (batch, head, row), the log-sum-exp, and a copy of its output, in the
// backend's AttnSaved entry keyed by q's storage, because attention_grad's
// operands are (do, q, k, v): it needs lse and rowsum(dO∘O) but not O itself.
// Without a saved forward (kernel tests, a plan that rewrote q) the gradient
// recomputes it.
//
// Three implementations: cuDNN's fused flash attention where it loads
// (CudnnAttention.cu; bf16, head dims that are multiples of 8 up to 256
// where cuDNN has an engine), tensor-core kernels
// (FlashMma.cu; bf16 operands, head dim 64 or 128) and the generic warp-per-row kernels here (any head dim
// up to 256, fp32 math), used for other shapes and as the reference the fast
// path is tested against. Rotary embeddings are applied by rotating q and k
// into scratch first; their gradients are rotated back (the rotation is
// orthogonal, so its gradient is the inverse rotation).
//
// Grouped-query attention: cuDNN reads the key/value heads in place (query
// head i reads kv head i / group) and writes dK, dV at their own width; the
// own kernels see k and v repeated to every query head and sum dK, dV back
// over each group.
//
//===----------------------------------------------------------------------===//
#include "Attention.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr int kMaxDPL = 8; // head dim ≤ 32·8

/// cos and sin of position t times frequency i < R/2 (base^(-2i/R)), as
/// [T, R/2] float2: computed in double once per attention call, so the
/// rotations themselves are plain memory passes.
__global__ void rotaryTableKernel(float2 *tab, int64_t T, int64_t R, double base) {
  int64_t half = R / 2;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < T * half;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = idx / half, i = idx % half;
    double sn, cs;
    sincos(t * ::pow(base, -2.0 * i / R), &sn, &cs);
    tab[idx] = make_float2(static_cast<float>(cs), static_cast<float>(sn));
  }
}

/// dst = src rotated (or rotated back) per head of D columns, rows of
/// `width` = heads·D: the first R columns of each head in pairs (c, c+R/2)
/// (R < D: GPT-NeoX's partial rotary), the rest copied. One thread per pair
/// or copied column; dst may be src.
__global__ void rotaryKernel(DView src, DView dst, const float2 *tab,
                             int64_t rows, int64_t T, int64_t width, int64_t D,
                             int64_t R, int inverse) {
  int64_t half = R / 2, per = D - half, heads = width / D, n = rows * heads * per;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = idx % per, head = idx / per; // head counts over rows too
    int64_t first = head * D, t = (head / heads) % T;
    if (s >= half) {
      dst.st(first + s + half, src.ld(first + s + half));
      continue;
    }
    float2 cs = tab[t * half + s];
    float sn = inverse ? -cs.y : cs.y;
    float x0 = src.ld(first + s), x1 = src.ld(first + s + half);
    dst.st(first + s, x0 * cs.x - x1 * sn);
    dst.st(first + s + half, x1 * cs.x + x0 * sn);
  }
}

/// rotaryKernel eight columns a thread: 16-byte loads and stores (bf16 or
/// fp32) and one index division per eight pairs; for R a multiple of 16,
/// D − R a multiple of 8 and 16-byte aligned src/dst (`rotate` checks).
/// The rotation is memory-bound: the scalar kernel reached about a third
/// of the bandwidth (3.56 ms for 96 launches a LLaMA-1B step, H100).
__global__ void rotaryKernel8(DView src, DView dst, const float2 *tab,
                              int64_t rows, int64_t T, int64_t width,
                              int64_t D, int64_t R, int inverse) {
  int64_t half = R / 2, per8 = (D - half) / 8, heads = width / D;
  int64_t n = rows * heads * per8;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t s = (idx % per8) * 8, head = idx / per8; // head counts over rows
    int64_t first = head * D, t = (head / heads) % T;
    float x0[8], x1[8];
    if (s >= half) {
      src.ld8(first + s + half, x1);
      dst.st8(first + s + half, x1);
      continue;
    }
    src.ld8(first + s, x0);
    src.ld8(first + s + half, x1);
    const float4 *cs4 = reinterpret_cast<const float4 *>(tab + t * half + s);
    float y0[8], y1[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float4 c = cs4[j]; // (cos, sin) of pairs 2j and 2j + 1
      float sn0 = inverse ? -c.y : c.y, sn1 = inverse ? -c.w : c.w;
      y0[2 * j] = x0[2 * j] * c.x - x1[2 * j] * sn0;
      y1[2 * j] = x1[2 * j] * c.x + x0[2 * j] * sn0;
      y0[2 * j + 1] = x0[2 * j + 1] * c.z - x1[2 * j + 1] * sn1;
      y1[2 * j + 1] = x1[2 * j + 1] * c.z + x0[2 * j + 1] * sn1;
    }
    dst.st8(first + s, y0);
    dst.st8(first + s + half, y1);
  }
}

struct Geo {
  int64_t B, T, H, heads, D;
  int64_t hk; // k/v width: kv heads · D (H without grouped-query attention)
  const float2 *rotaryTable; // rotary's cos/sin (null without rotary)
  float scale;
  int causal;
  float softcap;  // 0: off; scores become softcap·tanh(s/softcap)
  int64_t window; // 0: off; query i sees keys j with i − j < window
  double dropP;   // attention dropout (0: off)
  uint64_t dropSeed, step;
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Dropout's factor for P[b, hd, i, j] (0 or 1/(1 − p)): the counter-based
/// mask of docs/semantics.md, as the CPU kernel and the dropout op draw it.
__device__ __forceinline__ float dropFactor(const Geo &g, int64_t b, int64_t hd,
                                            int64_t i, int64_t j) {
  if (g.dropP == 0)
    return 1.0f;
  uint64_t n = static_cast<uint64_t>(((b * g.heads + hd) * g.T + i) * g.T + j);
  uint64_t r = splitmix64(g.dropSeed ^ splitmix64(g.step ^ splitmix64(n)));
  float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  return static_cast<double>(u) >= g.dropP
             ? static_cast<float>(1.0 / (1.0 - g.dropP))
             : 0.0f;
}

/// The score of (query row, key row) after scale and cap; `t` gets
/// tanh(s/cap) for the gradient (0 without a cap).
__device__ __forceinline__ float score(float raw, const Geo &g, float &t) {
  float s = g.scale * raw;
  if (g.softcap > 0) {
    t = tanhf(s / g.softcap);
    return g.softcap * t;
  }
  t = 0;
  return s;
}

__device__ __forceinline__ int64_t firstKey(int64_t i, const Geo &g) {
  return g.window && i - g.window + 1 > 0 ? i - g.window + 1 : 0;
}

__device__ __forceinline__ float dotRow(DView a, int64_t ra, DView b, int64_t rb,
                                        int D, int lane) {
  float s = 0;
  for (int d = lane; d < D; d += 32)
    s += a.ld(ra + d) * b.ld(rb + d);
  return warpSum(s);
}

/// One warp per (b, head, query row).
__global__ void attnFwdGeneric(DView q, DView k, DView v, DView o, float *lse,
                               Geo g) {
  int lane = threadIdx.x & 31;
  int64_t rows = g.B * g.heads * g.T;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t i = r % g.T, bh = r / g.T, hd = bh % g.heads, b = bh / g.heads;
    int64_t qrow = (b * g.T + i) * g.H + hd * g.D;
    float acc[kMaxDPL];
#pragma unroll
    for (int j = 0; j < kMaxDPL; ++j)
      acc[j] = 0;
    float m = -INFINITY, l = 0, t;
    int64_t last = g.causal ? i : g.T - 1;
    for (int64_t j = firstKey(i, g); j <= last; ++j) {
      int64_t krow = (b * g.T + j) * g.H + hd * g.D;
      float s = score(dotRow(q, qrow, k, krow, g.D, lane), g, t);
      float mn = fmaxf(m, s);
      float corr = m == -INFINITY ? 0.0f : expf(m - mn);
      float p = expf(s - mn);
      l = l * corr + p;
      float pv = p * dropFactor(g, b, hd, i, j); // the normalizer keeps p
#pragma unroll
      for (int jj = 0; jj < kMaxDPL; ++jj) {
        int d = lane + 32 * jj;
        if (d < g.D)
          acc[jj] = acc[jj] * corr + pv * v.ld(krow + d);
      }
      m = mn;
    }
#pragma unroll
    for (int jj = 0; jj < kMaxDPL; ++jj) {
      int d = lane + 32 * jj;
      if (d < g.D)
        o.st(qrow + d, l > 0 ? acc[jj] / l : 0.0f);
    }
    if (lane == 0)
      lse[r] = l > 0 ? m + logf(l) : -INFINITY;
  }
}

/// delta[r] = Σ_d dO·O per (b, head, row).
__global__ void attnDelta(DView dout, DView o, float *delta, Geo g) {
  int lane = threadIdx.x & 31;
  int64_t rows = g.B * g.heads * g.T;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t i = r % g.T, bh = r / g.T, hd = bh % g.heads, b = bh / g.heads;
    int64_t row = (b * g.T + i) * g.H + hd * g.D;
    float s = dotRow(dout, row, o, row, g.D, lane);
    if (lane == 0)
      delta[r] = s;
  }
}

/// dQ: one warp per query row.
__global__ void attnDqGeneric(DView dout, DView q, DView k, DView v,
                              const float *lse, const float *delta, DView dq,
                              Geo g) {
  int lane = threadIdx.x & 31;
  int64_t rows = g.B * g.heads * g.T;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t i = r % g.T, bh = r / g.T, hd = bh % g.heads, b = bh / g.heads;
    int64_t qrow = (b * g.T + i) * g.H + hd * g.D;
    float acc[kMaxDPL];
#pragma unroll
    for (int j = 0; j < kMaxDPL; ++j)
      acc[j] = 0;
    float li = lse[r], di = delta[r], t;
    int64_t last = g.causal ? i : g.T - 1;
    for (int64_t j = firstKey(i, g); j <= last; ++j) {
      int64_t krow = (b * g.T + j) * g.H + hd * g.D;
      float p = expf(score(dotRow(q, qrow, k, krow, g.D, lane), g, t) - li);
      float dp = dotRow(dout, qrow, v, krow, g.D, lane) * dropFactor(g, b, hd, i, j);
      float ds = p * (dp - di) * (1 - t * t);
#pragma unroll
      for (int jj = 0; jj < kMaxDPL; ++jj) {
        int d = lane + 32 * jj;
        if (d < g.D)
          acc[jj] += ds * k.ld(krow + d);
      }
    }
#pragma unroll
    for (int jj = 0; jj < kMaxDPL; ++jj) {
      int d = lane + 32 * jj;
      if (d < g.D)
        dq.st(qrow + d, g.scale * acc[jj]);
    }
  }
}

/// dK, dV: one warp per key row.
__global__ void attnDkvGeneric(DView dout, DView q, DView k, DView v,
                               const float *lse, const float *delta, DView dk,
                               DView dv, Geo g) {
  int lane = threadIdx.x & 31;
  int64_t rows = g.B * g.heads * g.T;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
       r < rows; r += warps) {
    int64_t j = r % g.T, bh = r / g.T, hd = bh % g.heads, b = bh / g.heads;
    int64_t krow = (b * g.T + j) * g.H + hd * g.D;
    float ak[kMaxDPL], av[kMaxDPL];
#pragma unroll
    for (int x = 0; x < kMaxDPL; ++x)
      ak[x] = av[x] = 0;
    int64_t end = g.window && j + g.window < g.T ? j + g.window : g.T;
    float t;
    for (int64_t i = g.causal ? j : 0; i < end; ++i) {
      int64_t qrow = (b * g.T + i) * g.H + hd * g.D;
      int64_t lr = bh * g.T + i;
      float p = expf(score(dotRow(q, qrow, k, krow, g.D, lane), g, t) - lse[lr]);
      float drop = dropFactor(g, b, hd, i, j);
      float dp = dotRow(dout, qrow, v, krow, g.D, lane) * drop;
      float ds = p * (dp - delta[lr]) * (1 - t * t);
#pragma unroll
      for (int x = 0; x < kMaxDPL; ++x) {
        int d = lane + 32 * x;
        if (d < g.D) {
          av[x] += p * drop * dout.ld(qrow + d);
          ak[x] += ds * q.ld(qrow + d);
        }
      }
    }
#pragma unroll
    for (int x = 0; x < kMaxDPL; ++x) {
      int d = lane + 32 * x;
      if (d < g.D) {
        dk.st(krow + d, g.scale * ak[x]);
        dv.st(krow + d, av[x]);
      }
    }
  }
}

// Grouped-query attention runs on the multi-head kernels: k and v are
// repeated to every query head (head i reads key/value head i / group) and
// the full-width dK, dV are summed back over each group.
__global__ void repeatKV(DView src, DView dst, int64_t rows, int64_t hk,
                         int64_t h, int64_t d, int64_t group) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * h;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / h, c = i % h;
    dst.st(i, src.ld(r * hk + (c / d) / group * d + c % d));
  }
}

__global__ void sumKVGroups(DView src, DView dst, int64_t rows, int64_t hk,
                            int64_t h, int64_t d, int64_t group) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * hk;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / hk, c = i % hk, kvh = c / d, e = c % d;
    float s = 0;
    for (int64_t g = 0; g < group; ++g)
      s += src.ld(r * h + (kvh * group + g) * d + e);
    dst.st(i, s);
  }
}

/// k or v ([rows, hk]) widened to H columns in scratch slot `slot` (itself
/// when H wide).
DView repeatedKV(CudaBackend &be, DView v, int64_t rows, int64_t hk, int64_t H,
                 int64_t D, int slot) {
  if (hk == H)
    return v;
  DView out{be.scratch(rows * H * (v.bf16 ? 2 : 4), slot), v.bf16};
  repeatKV<<<gridFor(rows * H, 256), 256, 0, be.stream()>>>(v, out, rows, hk, H,
                                                            D, H / hk);
  MAPP_CUDA_LAUNCHED();
  return out;
}

Geo geoOf(const KernelArgs &a, const Tensor &q, const Tensor &k) {
  Geo g;
  g.B = q.dim(0);
  g.T = q.dim(1);
  g.H = q.dim(2);
  g.hk = k.dim(2);
  g.rotaryTable = nullptr;
  g.heads = a.attrs.getInt("heads", 1);
  g.D = g.heads ? g.H / g.heads : 0;
  g.scale = static_cast<float>(a.attrs.getFloat("scale", 1.0));
  g.causal = a.attrs.flag("causal") ? 1 : 0;
  g.softcap = static_cast<float>(a.attrs.getFloat("softcap", 0.0));
  g.window = a.attrs.getInt("sliding_window", 0);
  g.dropP = a.attrs.getFloat("dropout", 0.0);
  g.dropSeed = static_cast<uint64_t>(a.attrs.getInt("dropout_seed", 0));
  g.step = static_cast<uint64_t>(a.ctx.step);
  return g;
}

/// Softcap, sliding windows and attention dropout run on the generic
/// kernels only (the flash, tensor-core and cuDNN paths know plain causal
/// softmax).
bool plainScores(const Geo &g) {
  return g.softcap == 0 && g.window == 0 && g.dropP == 0;
}

int64_t rotaryDimOf(const KernelArgs &a, const Geo &g) {
  return a.attrs.getInt("rotary_dim", g.D);
}

int warpGrid(int64_t rows) { return gridFor(rows * 32, 256, 1 << 20); }

/// The call's rotary table (scratch slot 12) into g, when it rotates.
void makeRotaryTable(CudaBackend &be, const KernelArgs &a, Geo &g) {
  if (!a.attrs.flag("rotary"))
    return;
  int64_t entries = g.T * (rotaryDimOf(a, g) / 2);
  auto *tab = static_cast<float2 *>(be.scratch(entries * sizeof(float2), 12));
  rotaryTableKernel<<<gridFor(entries, 256), 256, 0, be.stream()>>>(
      tab, g.T, rotaryDimOf(a, g), a.attrs.getFloat("rotary_base", 10000.0));
  MAPP_CUDA_LAUNCHED();
  g.rotaryTable = tab;
}

/// src rotated into dst ([B,T,width] rows of heads of g.D), or rotated back.
void rotate(CudaBackend &be, const KernelArgs &a, const Geo &g, DView src,
            DView dst, int64_t width, int inverse) {
  int64_t R = rotaryDimOf(a, g);
  int64_t n = g.B * g.T * (width / g.D) * (g.D - R / 2);
  auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (R % 16 == 0 && (g.D - R) % 8 == 0 && aligned(src.p) && aligned(dst.p) &&
      aligned(g.rotaryTable))
    rotaryKernel8<<<gridFor(n / 8, 256), 256, 0, be.stream()>>>(
        src, dst, g.rotaryTable, g.B * g.T, g.T, width, g.D, R, inverse);
  else
    rotaryKernel<<<gridFor(n, 256), 256, 0, be.stream()>>>(
        src, dst, g.rotaryTable, g.B * g.T, g.T, width, g.D, R, inverse);
  MAPP_CUDA_LAUNCHED();
}

/// q and k as the kernels see them: rotated copies with rotary.
struct QK {
  DView q, k;
};

QK rotated(CudaBackend &be, const KernelArgs &a, const Geo &g, DView q,
           DView k, int slotQ, int slotK) {
  if (!a.attrs.flag("rotary"))
    return {q, k};
  int64_t n = g.B * g.T * g.H, nk = g.B * g.T * g.hk;
  // Rotated copies keep the operands' storage type (bf16 stays on the
  // tensor-core path); k keeps its own width (kv heads).
  DView qr{be.scratch(n * (q.bf16 ? 2 : 4), slotQ), q.bf16};
  DView kr{be.scratch(nk * (k.bf16 ? 2 : 4), slotK), k.bf16};
  rotate(be, a, g, q, qr, g.H, 0);
  rotate(be, a, g, k, kr, g.hk, 0);
  return {qr, kr};
}

AttnCall callOf(const Geo &g) {
  return {g.B, g.T, g.H, g.heads, g.D, g.hk / g.D, g.scale, g.causal};
}

/// The own kernels' k and v: repeated to every query head (slots 6, 7).
struct WideKV {
  DView k, v;
};
WideKV widened(CudaBackend &be, const Geo &g, DView k, DView v) {
  int64_t rows = g.B * g.T;
  return {repeatedKV(be, k, rows, g.hk, g.H, g.D, 6),
          repeatedKV(be, v, rows, g.hk, g.H, g.D, 7)};
}

/// cuDNN takes plain causal/full softmax on bf16 operands; it decides on
/// the head dim (a multiple of 8 up to 256, engines permitting) itself.
bool cudnnOperands(const Geo &g, std::initializer_list<DView> xs) {
  if (!plainScores(g))
    return false;
  for (const DView &x : xs)
    if (!x.bf16)
      return false;
  return true;
}

void forwardInto(CudaBackend &be, const Geo &g, QK qk, DView v, DView o,
                 float *lse) {
  if (cudnnOperands(g, {qk.q, qk.k, v, o}) &&
      cudnnAttnForward(be, callOf(g), qk.q.p, qk.k.p, v.p, o.p, lse))
    return;
  bool flash = plainScores(g) && flashSupported(g.D, qk.q, qk.k, v, qk.q);
  WideKV w = widened(be, g, qk.k, v);
  if (flash) {
    flashForward(be, qk.q, w.k, w.v, o, lse, g.B, g.T, g.H, g.heads, g.D,
                 g.scale, g.causal);
    return;
  }
  attnFwdGeneric<<<warpGrid(g.B * g.heads * g.T), 256, 0, be.stream()>>>(
      qk.q, w.k, w.v, o, lse, g);
  MAPP_CUDA_LAUNCHED();
}

void checkGeo(const Geo &g, const Tensor &k, const char *what) {
  if (g.D && (k.dim(2) % g.D || k.dim(2) == 0 || g.heads % (k.dim(2) / g.D)))
    fail(what, ": k/v width ", k.dim(2), " is not a divisor of heads ", g.heads,
         " key/value heads of ", g.D);
  if (g.D > 32 * kMaxDPL)
    fail(what, ": head dim ", g.D, " exceeds the CUDA backend's ", 32 * kMaxDPL);
  if (g.heads <= 0 || g.D * g.heads != g.H)
    fail(what, ": heads ", g.heads, " does not divide hidden ", g.H);
}

} // namespace

void cuda::attention(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  Geo g = geoOf(a, a.in[0], a.in[1]);
  checkGeo(g, a.in[1], "attention");
  if (!g.T || !g.D || !g.B)
    return;
  makeRotaryTable(be, a, g);
  int64_t rows = g.B * g.heads * g.T, n = g.B * g.T * g.H;
  AttnSaved &sv = be.attnSaved(a.in[0].data, rows, n, isBf16(a.out[0]));
  sv.q = a.in[0].data;
  sv.k = a.in[1].data;
  sv.v = a.in[2].data;
  QK qk = rotated(be, a, g, view(a.in[0]), view(a.in[1]), 0, 3);
  forwardInto(be, g, qk, view(a.in[2]), view(a.out[0]), sv.lse);
  MAPP_CUDA_CHECK(cudaMemcpyAsync(sv.o, a.out[0].data, n * storedSize(a.out[0]),
                                  cudaMemcpyDeviceToDevice, be.stream()));
}

/// cuDNN's fused backward: bf16 everything, rowsum(dO∘O) computed inside,
/// kv-wide dK, dV. With rotary, the q and k gradients land in bf16 scratch
/// (slots 10, 11) and are rotated back into dq, dk. False when cuDNN does
/// not run the shape (nothing written).
bool cudnnBackward(CudaBackend &be, const KernelArgs &a, const Geo &g, QK qk,
                   DView v, DView o, DView dout, const float *lse, DView dq,
                   DView dk, DView dv) {
  if (!cudnnOperands(g, {qk.q, qk.k, v, o, dout, dq, dk, dv}))
    return false;
  bool rotary = a.attrs.flag("rotary");
  DView dqr = dq, dkr = dk;
  if (rotary) {
    dqr = {be.scratch(g.B * g.T * g.H * 2, 10), 1};
    dkr = {be.scratch(g.B * g.T * g.hk * 2, 11), 1};
  }
  if (!cudnnAttnBackward(be, callOf(g), qk.q.p, qk.k.p, v.p, o.p, dout.p, lse,
                         dqr.p, dkr.p, dv.p))
    return false;
  if (rotary) {
    rotate(be, a, g, dqr, dq, g.H, 1);
    rotate(be, a, g, dkr, dk, g.hk, 1);
  }
  return true;
}

void cuda::attention_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  Geo g = geoOf(a, a.in[1], a.in[2]);
  checkGeo(g, a.in[2], "attention_grad");
  if (!g.T || !g.D || !g.B)
    return;
  makeRotaryTable(be, a, g);
  int64_t rows = g.B * g.heads * g.T, n = g.B * g.T * g.H;
  bool rotary = a.attrs.flag("rotary");
  const bool gqa = g.hk != g.H;
  QK qk = rotated(be, a, g, view(a.in[1]), view(a.in[2]), 0, 3);
  DView dout = view(a.in[0]), v = view(a.in[3]);
  AttnSaved *sv = be.findAttn(a.in[1].data, a.in[2].data, a.in[3].data);
  const float *lse;
  DView o;
  if (sv && sv->rows >= rows && sv->numel >= n) {
    lse = sv->lse;
    o = {sv->o, sv->oBf16};
    // Consumed: a later gradient on the same storage without a new forward
    // (storage reused for other data) must recompute, not read stale values.
    sv->q = nullptr;
  } else {
    // No saved forward: recompute it into scratch.
    float *l = static_cast<float *>(be.scratch(rows * 4 + n * 4, 2));
    o = {l + rows, 0};
    forwardInto(be, g, qk, v, o, l);
    lse = l;
  }
  DView dq = view(a.out[0]), dk = view(a.out[1]), dv = view(a.out[2]);
  // cuDNN's backward accumulates dQ with atomics: MAPP_CUDA_DETERMINISTIC=1
  // runs the own kernels (their forward outputs are interchangeable).
  if (!be.config().deterministic &&
      cudnnBackward(be, a, g, qk, v, o, dout, lse, dq, dk, dv))
    return;
  // The own kernels: k, v repeated to every query head; with GQA, full-width
  // fp32 dK, dV in scratch, summed per group at the end.
  WideKV w = widened(be, g, qk.k, v);
  DView dkOut = dk, dvOut = dv;
  if (gqa) {
    dk = {be.scratch(n * 4, 8), 0};
    dv = {be.scratch(n * 4, 9), 0};
  }
  // Slot 1: delta, then (with rotary) fp32 gradients w.r.t. the rotated q
  // and k, rotated back into dq/dk at the end.
  float *buf = static_cast<float *>(be.scratch(rows * 4 + (rotary ? 2 * n * 4 : 0), 1));
  float *delta = buf;
  attnDelta<<<warpGrid(rows), 256, 0, be.stream()>>>(dout, o, delta, g);
  MAPP_CUDA_LAUNCHED();
  DView dqr = dq, dkr = dk;
  if (rotary) {
    dqr = {buf + rows, 0};
    dkr = {buf + rows + n, 0};
  }
  if (plainScores(g) && flashSupported(g.D, qk.q, w.k, w.v, dout) &&
      flashBwdSupported(dqr, dkr, dv)) {
    flashBackward(be, dout, qk.q, w.k, w.v, lse, delta, dqr, dkr, dv, g.B, g.T,
                  g.H, g.heads, g.D, g.scale, g.causal);
  } else {
    attnDqGeneric<<<warpGrid(rows), 256, 0, be.stream()>>>(dout, qk.q, w.k, w.v,
                                                           lse, delta, dqr, g);
    MAPP_CUDA_LAUNCHED();
    attnDkvGeneric<<<warpGrid(rows), 256, 0, be.stream()>>>(
        dout, qk.q, w.k, w.v, lse, delta, dkr, dv, g);
    MAPP_CUDA_LAUNCHED();
  }
  if (rotary) {
    // Full width here: the group sum below commutes with the rotation.
    rotate(be, a, g, dqr, dq, g.H, 1);
    rotate(be, a, g, dkr, dk, g.H, 1);
  }
  if (gqa) {
    int64_t rowsBT = g.B * g.T;
    for (auto [src, dst] : {std::pair{dk, dkOut}, std::pair{dv, dvOut}}) {
      sumKVGroups<<<gridFor(rowsBT * g.hk, 256), 256, 0, be.stream()>>>(
          src, dst, rowsBT, g.hk, g.H, g.D, g.H / g.hk);
      MAPP_CUDA_LAUNCHED();
    }
  }
}

//===- FlashMma.cu - flash attention on mma.sync (bf16, fp32 accumulate) --===//
//
// FlashAttention-2 on m16n8k16 mma.sync with register accumulators:
// ldmatrix feeds the fragments from shared memory, the score accumulators
// are reused directly as the A fragments of P·V, and row statistics are
// reduced across the 4 lanes of a quad.
//
// Forward: 4 warps × 16 query rows; 64-key K/V tiles double-buffered with
// cp.async. Backward: a block owns 64 keys; per 64-query tile, warps 0-3
// compute Pᵀ and dV += Pᵀ·dO, warps 4-7 compute Pᵀ, dPᵀ = V·dOᵀ, dSᵀ and
// dK += dSᵀ·Q (register accumulators each; Sᵀ is computed by both groups,
// which costs one extra product but keeps each warp under 255 registers),
// then all 8 warps form dQ = dS·K from dSᵀ in shared memory and add it into
// an fp32 accumulator with vector atomics. The atomics' order varies run to
// run; with MAPP_CUDA_DETERMINISTIC=1 the backward skips that step and a
// separate pass over query tiles (dqKernel) forms dQ, recomputing P and dP.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane/4, t = lane%4):
// A: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..);
// B: b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g); C: c0,c1 (g, 2t..) c2,c3 (g+8, 2t..).
//
//===----------------------------------------------------------------------===//
#include "Attention.h"

#include <cstdlib>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

using bf16 = __nv_bfloat16;
constexpr int BR = 64, BC = 64;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t smemAddr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smemAddr(p)));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void *p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(smemAddr(p)));
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4],
                                    uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ void cpAsync16(void *dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smemAddr(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cpCommit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cpWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// 64 rows × D of a [B,T,H] head slice into shared rows of LD (zeros past T).
template <int D, int NT>
__device__ __forceinline__ void tileAsync(bf16 *dst, const bf16 *base, int64_t H,
                                          int64_t t0, int64_t T) {
  constexpr int CH = D / 8, LD = D + 8;
  for (int c = threadIdx.x; c < 64 * CH; c += NT) {
    int r = c / CH, cc = (c % CH) * 8;
    int64_t t = t0 + r;
    bool ok = t < T;
    cpAsync16(dst + r * LD + cc, base + (ok ? t : 0) * H + cc, ok);
  }
}

template <int D>
__global__ void __launch_bounds__(128)
    fwdKernel(const bf16 *q, const bf16 *k, const bf16 *v, DView o, float *lse,
              int64_t T, int64_t H, int heads, float scale, int causal) {
  constexpr int LD = D + 8, NT = 128;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sQ + BR * LD; // [2][BC][LD]
  bf16 *sV = sK + 2 * BC * LD;

  int nQ = static_cast<int>((T + BR - 1) / BR);
  int qb = nQ - 1 - blockIdx.x;
  int64_t bh = blockIdx.y, b = bh / heads, hd = bh % heads;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t4 = lane & 3;
  size_t off = static_cast<size_t>(b) * T * H + hd * D;
  const bf16 *qg = q + off, *kg = k + off, *vg = v + off;

  int nK = static_cast<int>((T + BC - 1) / BC);
  if (causal)
    nK = min(nK, qb + 1);
  tileAsync<D, NT>(sQ, qg, H, int64_t(qb) * BR, T);
  tileAsync<D, NT>(sK, kg, H, 0, T);
  tileAsync<D, NT>(sV, vg, H, 0, T);
  cpCommit();

  uint32_t qf[D / 16][4];
  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float sl2 = scale * kLog2e;
  const int64_t row0 = int64_t(qb) * BR + warp * 16 + g, row1 = row0 + 8;

  for (int kt = 0; kt < nK; ++kt) {
    int buf = kt & 1;
    if (kt + 1 < nK) {
      tileAsync<D, NT>(sK + (buf ^ 1) * BC * LD, kg, H, int64_t(kt + 1) * BC, T);
      tileAsync<D, NT>(sV + (buf ^ 1) * BC * LD, vg, H, int64_t(kt + 1) * BC, T);
      cpCommit();
      cpWait<1>();
    } else {
      cpWait<0>();
    }
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc)
        ldsm4(qf[kc], sQ + (warp * 16 + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
    }
    const bf16 *cK = sK + buf * BC * LD, *cV = sV + buf * BC * LD;
    float s[BC / 8][4];
#pragma unroll
    for (int i = 0; i < BC / 8; ++i)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int np = 0; np < BC / 16; ++np)
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t r[4];
        ldsm4(r, cK + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                     ((lane >> 3) & 1) * 8);
        mma(s[2 * np], qf[kc], r[0], r[1]);
        mma(s[2 * np + 1], qf[kc], r[2], r[3]);
      }
    // Scale into log2 units, mask, online softmax.
    bool diag = causal && kt == nK - 1;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int64_t key = int64_t(kt) * BC + nt * 8 + 2 * t4 + (e & 1);
        int64_t row = e < 2 ? row0 : row1;
        float x = s[nt][e] * sl2;
        if (key >= T || (diag && key > row))
          x = -INFINITY;
        s[nt][e] = x;
        if (e < 2)
          mx0 = fmaxf(mx0, x);
        else
          mx1 = fmaxf(mx1, x);
      }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
    float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    float b0 = n0 == -INFINITY ? 0.0f : n0, b1 = n1 == -INFINITY ? 0.0f : n1;
    float c0 = exp2f(m0 - b0), c1 = exp2f(m1 - b1); // 0 while m is -inf
    m0 = n0;
    m1 = n1;
    float ls0 = 0.0f, ls1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) {
      s[nt][0] = exp2f(s[nt][0] - b0);
      s[nt][1] = exp2f(s[nt][1] - b0);
      s[nt][2] = exp2f(s[nt][2] - b1);
      s[nt][3] = exp2f(s[nt][3] - b1);
      ls0 += s[nt][0] + s[nt][1];
      ls1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * c0 + ls0;
    l1 = l1 * c1 + ls1;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      acc[i][0] *= c0;
      acc[i][1] *= c0;
      acc[i][2] *= c1;
      acc[i][3] *= c1;
    }
#pragma unroll
    for (int kc = 0; kc < BC / 16; ++kc) {
      uint32_t pa[4] = {pack(s[2 * kc][0], s[2 * kc][1]), pack(s[2 * kc][2], s[2 * kc][3]),
                        pack(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                        pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t r[4];
        ldsm4t(r, cV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                      (lane >> 4) * 8);
        mma(acc[2 * dp], pa, r[0], r[1]);
        mma(acc[2 * dp + 1], pa, r[2], r[3]);
      }
    }
    __syncthreads(); // this buffer is refilled two iterations later
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
  }
  float i0 = l0 > 0 ? 1.0f / l0 : 0.0f, i1 = l1 > 0 ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    int col = i * 8 + 2 * t4;
    if (row0 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + row0) * H + hd * D + col;
      o.st(base, acc[i][0] * i0);
      o.st(base + 1, acc[i][1] * i0);
    }
    if (row1 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + row1) * H + hd * D + col;
      o.st(base, acc[i][2] * i1);
      o.st(base + 1, acc[i][3] * i1);
    }
  }
  if (t4 == 0) {
    constexpr float ln2 = 0.6931471805599453f;
    if (row0 < T)
      lse[bh * T + row0] = l0 > 0 ? (m0 + log2f(l0)) * ln2 : -INFINITY;
    if (row1 < T)
      lse[bh * T + row1] = l1 > 0 ? (m1 + log2f(l1)) * ln2 : -INFINITY;
  }
}

template <int D>
__global__ void __launch_bounds__(256)
    bwdKernel(const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
              const float *lse, const float *delta, float *dqAcc, DView dk,
              DView dv, int64_t T, int64_t H, int heads, float scale, int causal) {
  constexpr int LD = D + 8, NT = 256, LS = BR + 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sK = reinterpret_cast<bf16 *>(smem);
  bf16 *sV = sK + BC * LD;
  bf16 *sQ = sV + BC * LD;
  bf16 *sdO = sQ + BR * LD;
  bf16 *sdST = sdO + BR * LD; // [BC keys][LS]
  float *sLse = reinterpret_cast<float *>(sdST + BC * LS);
  float *sDelta = sLse + BR;

  int kb = blockIdx.x;
  int64_t bh = blockIdx.y, b = bh / heads, hd = bh % heads;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t4 = lane & 3;
  int grp = warp >> 2, wi = warp & 3; // grp 0: dV, grp 1: dK and dSᵀ
  size_t off = static_cast<size_t>(b) * T * H + hd * D;
  tileAsync<D, NT>(sK, k + off, H, int64_t(kb) * BC, T);
  tileAsync<D, NT>(sV, v + off, H, int64_t(kb) * BC, T);
  cpCommit();

  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  const float sl2 = scale * kLog2e;
  const int64_t key0 = int64_t(kb) * BC + wi * 16 + g, key1 = key0 + 8;
  int nQ = static_cast<int>((T + BR - 1) / BR);
  for (int qt = causal ? kb : 0; qt < nQ; ++qt) {
    __syncthreads(); // previous tile's sQ/sdO/sdST are no longer read
    tileAsync<D, NT>(sQ, q + off, H, int64_t(qt) * BR, T);
    tileAsync<D, NT>(sdO, dout + off, H, int64_t(qt) * BR, T);
    cpCommit();
    for (int i = threadIdx.x; i < BR; i += NT) {
      int64_t t = int64_t(qt) * BR + i;
      sLse[i] = t < T ? lse[bh * T + t] * kLog2e : INFINITY;
      sDelta[i] = t < T ? delta[bh * T + t] : 0.0f;
    }
    cpWait<0>();
    __syncthreads();
    // Sᵀ_w = K_w·Qᵀ: 16 keys × 64 queries.
    float s[BR / 8][4];
#pragma unroll
    for (int i = 0; i < BR / 8; ++i)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t a[4];
      ldsm4(a, sK + (wi * 16 + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < BR / 16; ++np) {
        uint32_t r[4];
        ldsm4(r, sQ + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                     ((lane >> 3) & 1) * 8);
        mma(s[2 * np], a, r[0], r[1]);
        mma(s[2 * np + 1], a, r[2], r[3]);
      }
    }
    bool diag = causal && qt == kb;
#pragma unroll
    for (int nt = 0; nt < BR / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int col = nt * 8 + 2 * t4 + (e & 1);
        int64_t qi = int64_t(qt) * BR + col;
        int64_t key = e < 2 ? key0 : key1;
        bool ok = qi < T && key < T && !(diag && key > qi);
        s[nt][e] = ok ? exp2f(s[nt][e] * sl2 - sLse[col]) : 0.0f;
      }
    if (grp == 0) {
      // dV_w += Pᵀ_w·dO.
#pragma unroll
      for (int kc = 0; kc < BR / 16; ++kc) {
        uint32_t pa[4] = {pack(s[2 * kc][0], s[2 * kc][1]), pack(s[2 * kc][2], s[2 * kc][3]),
                          pack(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                          pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t r[4];
          ldsm4t(r, sdO + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                        (lane >> 4) * 8);
          mma(acc[2 * dp], pa, r[0], r[1]);
          mma(acc[2 * dp + 1], pa, r[2], r[3]);
        }
      }
    } else {
      // dPᵀ_w = V_w·dOᵀ, then dSᵀ = Pᵀ∘(dPᵀ − delta).
      float dp[BR / 8][4];
#pragma unroll
      for (int i = 0; i < BR / 8; ++i)
        dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < D / 16; ++kc) {
        uint32_t a[4];
        ldsm4(a, sV + (wi * 16 + (lane & 15)) * LD + kc * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < BR / 16; ++np) {
          uint32_t r[4];
          ldsm4(r, sdO + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                       ((lane >> 3) & 1) * 8);
          mma(dp[2 * np], a, r[0], r[1]);
          mma(dp[2 * np + 1], a, r[2], r[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < BR / 8; ++nt) {
        int col = nt * 8 + 2 * t4;
        s[nt][0] *= dp[nt][0] - sDelta[col];
        s[nt][1] *= dp[nt][1] - sDelta[col + 1];
        s[nt][2] *= dp[nt][2] - sDelta[col];
        s[nt][3] *= dp[nt][3] - sDelta[col + 1];
        *reinterpret_cast<uint32_t *>(sdST + (wi * 16 + g) * LS + col) =
            pack(s[nt][0], s[nt][1]);
        *reinterpret_cast<uint32_t *>(sdST + (wi * 16 + g + 8) * LS + col) =
            pack(s[nt][2], s[nt][3]);
      }
      // dK_w += dSᵀ_w·Q.
#pragma unroll
      for (int kc = 0; kc < BR / 16; ++kc) {
        uint32_t pa[4] = {pack(s[2 * kc][0], s[2 * kc][1]), pack(s[2 * kc][2], s[2 * kc][3]),
                          pack(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                          pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int dq = 0; dq < D / 16; ++dq) {
          uint32_t r[4];
          ldsm4t(r, sQ + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dq * 16 +
                        (lane >> 4) * 8);
          mma(acc[2 * dq], pa, r[0], r[1]);
          mma(acc[2 * dq + 1], pa, r[2], r[3]);
        }
      }
    }
    __syncthreads(); // dSᵀ complete
    // dQ rows [wi·16, +16), columns [grp·D/2, +D/2) of this tile: dS·K
    // (not when dqKernel forms dQ: dqAcc null, uniform over the grid).
    if (dqAcc) {
      float qa[D / 16][4];
#pragma unroll
      for (int i = 0; i < D / 16; ++i)
        qa[i][0] = qa[i][1] = qa[i][2] = qa[i][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < BC / 16; ++kc) {
        uint32_t a[4];
        ldsm4t(a, sdST + (kc * 16 + (lane & 7) + ((lane >> 4) << 3)) * LS + wi * 16 +
                      ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
          uint32_t r[4];
          ldsm4t(r, sK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                        grp * (D / 2) + dp * 16 + (lane >> 4) * 8);
          mma(qa[2 * dp], a, r[0], r[1]);
          mma(qa[2 * dp + 1], a, r[2], r[3]);
        }
      }
      int64_t r0 = int64_t(qt) * BR + wi * 16 + g, r1 = r0 + 8;
#pragma unroll
      for (int i = 0; i < D / 16; ++i) {
        int col = grp * (D / 2) + i * 8 + 2 * t4;
        if (r0 < T)
          atomicAdd(reinterpret_cast<float2 *>(
                        dqAcc + (static_cast<int64_t>(b) * T + r0) * H + hd * D + col),
                    make_float2(qa[i][0], qa[i][1]));
        if (r1 < T)
          atomicAdd(reinterpret_cast<float2 *>(
                        dqAcc + (static_cast<int64_t>(b) * T + r1) * H + hd * D + col),
                    make_float2(qa[i][2], qa[i][3]));
      }
    }
  }
  // Write dV (group 0) or dK·scale (group 1).
  DView dst = grp == 0 ? dv : dk;
  float f = grp == 0 ? 1.0f : scale;
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    int col = i * 8 + 2 * t4;
    if (key0 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + key0) * H + hd * D + col;
      dst.st(base, acc[i][0] * f);
      dst.st(base + 1, acc[i][1] * f);
    }
    if (key1 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + key1) * H + hd * D + col;
      dst.st(base, acc[i][2] * f);
      dst.st(base + 1, acc[i][3] * f);
    }
  }
}

/// Deterministic dQ (MAPP_CUDA_DETERMINISTIC=1): a block owns 64 query rows
/// (4 warps × 16, as the forward) and walks the key tiles in order,
/// recomputing S = Q·Kᵀ, P, dP = dO·Vᵀ and dS = P∘(dP − delta), and adding
/// dS·K into register accumulators; each dQ element is written once, so the
/// sum's order is fixed. Q and dO fragments are read from shared memory per
/// k-chunk (not held in registers) to leave room for S, dP and dQ.
template <int D>
__global__ void __launch_bounds__(128)
    dqKernel(const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
             const float *lse, const float *delta, DView dq, int64_t T,
             int64_t H, int heads, float scale, int causal) {
  constexpr int LD = D + 8, NT = 128;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sdO = sQ + BR * LD;
  bf16 *sK = sdO + BR * LD; // [2][BC][LD]
  bf16 *sV = sK + 2 * BC * LD;

  int nQ = static_cast<int>((T + BR - 1) / BR);
  int qb = nQ - 1 - blockIdx.x; // longest causal rows first
  int64_t bh = blockIdx.y, b = bh / heads, hd = bh % heads;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int g = lane >> 2, t4 = lane & 3;
  size_t off = static_cast<size_t>(b) * T * H + hd * D;
  const bf16 *kg = k + off, *vg = v + off;

  int nK = static_cast<int>((T + BC - 1) / BC);
  if (causal)
    nK = min(nK, qb + 1);
  tileAsync<D, NT>(sQ, q + off, H, int64_t(qb) * BR, T);
  tileAsync<D, NT>(sdO, dout + off, H, int64_t(qb) * BR, T);
  tileAsync<D, NT>(sK, kg, H, 0, T);
  tileAsync<D, NT>(sV, vg, H, 0, T);
  cpCommit();

  float acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  const float sl2 = scale * kLog2e;
  const int64_t row0 = int64_t(qb) * BR + warp * 16 + g, row1 = row0 + 8;
  // Rows past T: P = exp2(x − ∞) = 0, so dS = 0.
  const float l0 = row0 < T ? lse[bh * T + row0] * kLog2e : INFINITY;
  const float l1 = row1 < T ? lse[bh * T + row1] * kLog2e : INFINITY;
  const float d0 = row0 < T ? delta[bh * T + row0] : 0.0f;
  const float d1 = row1 < T ? delta[bh * T + row1] : 0.0f;
  const bf16 *wQ = sQ + warp * 16 * LD, *wdO = sdO + warp * 16 * LD;

  for (int kt = 0; kt < nK; ++kt) {
    int buf = kt & 1;
    if (kt + 1 < nK) {
      tileAsync<D, NT>(sK + (buf ^ 1) * BC * LD, kg, H, int64_t(kt + 1) * BC, T);
      tileAsync<D, NT>(sV + (buf ^ 1) * BC * LD, vg, H, int64_t(kt + 1) * BC, T);
      cpCommit();
      cpWait<1>();
    } else {
      cpWait<0>();
    }
    __syncthreads();
    const bf16 *cK = sK + buf * BC * LD, *cV = sV + buf * BC * LD;
    // S_w = Q_w·Kᵀ and dP_w = dO_w·Vᵀ: 16 queries × 64 keys each.
    float s[BC / 8][4], dp[BC / 8][4];
#pragma unroll
    for (int i = 0; i < BC / 8; ++i)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = dp[i][0] = dp[i][1] = dp[i][2] =
          dp[i][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t aq[4], ad[4];
      ldsm4(aq, wQ + (lane & 15) * LD + kc * 16 + (lane >> 4) * 8);
      ldsm4(ad, wdO + (lane & 15) * LD + kc * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < BC / 16; ++np) {
        int r = (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kc * 16 +
                ((lane >> 3) & 1) * 8;
        uint32_t rk[4], rv[4];
        ldsm4(rk, cK + r);
        ldsm4(rv, cV + r);
        mma(s[2 * np], aq, rk[0], rk[1]);
        mma(s[2 * np + 1], aq, rk[2], rk[3]);
        mma(dp[2 * np], ad, rv[0], rv[1]);
        mma(dp[2 * np + 1], ad, rv[2], rv[3]);
      }
    }
    // dS = P∘(dP − delta), P from the saved log-sum-exp.
    bool diag = causal && kt == nK - 1;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int64_t key = int64_t(kt) * BC + nt * 8 + 2 * t4 + (e & 1);
        int64_t row = e < 2 ? row0 : row1;
        bool ok = key < T && !(diag && key > row);
        float p = ok ? exp2f(s[nt][e] * sl2 - (e < 2 ? l0 : l1)) : 0.0f;
        s[nt][e] = p * (dp[nt][e] - (e < 2 ? d0 : d1));
      }
    // dQ_w += dS_w·K.
#pragma unroll
    for (int kc = 0; kc < BC / 16; ++kc) {
      uint32_t pa[4] = {pack(s[2 * kc][0], s[2 * kc][1]), pack(s[2 * kc][2], s[2 * kc][3]),
                        pack(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                        pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int dc = 0; dc < D / 16; ++dc) {
        uint32_t r[4];
        ldsm4t(r, cK + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dc * 16 +
                      (lane >> 4) * 8);
        mma(acc[2 * dc], pa, r[0], r[1]);
        mma(acc[2 * dc + 1], pa, r[2], r[3]);
      }
    }
    __syncthreads(); // this buffer is refilled two iterations later
  }
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    int col = i * 8 + 2 * t4;
    if (row0 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + row0) * H + hd * D + col;
      dq.st(base, acc[i][0] * scale);
      dq.st(base + 1, acc[i][1] * scale);
    }
    if (row1 < T) {
      int64_t base = (static_cast<int64_t>(b) * T + row1) * H + hd * D + col;
      dq.st(base, acc[i][2] * scale);
      dq.st(base + 1, acc[i][3] * scale);
    }
  }
}

__global__ void scaleInto(const float *src, DView dst, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst.st(i, src[i] * s);
}

bool useWmma(const CudaBackend &be) { return attnImpl(be) == AttnImpl::Wmma; }

template <int D>
void fwd(CudaBackend &be, DView q, DView k, DView v, DView o, float *lse,
         int64_t B, int64_t T, int64_t H, int64_t heads, float scale, int causal) {
  constexpr int LD = D + 8;
  size_t smem = (BR + 4 * BC) * LD * 2;
  static bool raised = false;
  if (!raised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        fwdKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = true;
  }
  dim3 grid(static_cast<unsigned>((T + BR - 1) / BR), static_cast<unsigned>(B * heads));
  fwdKernel<D><<<grid, 128, smem, be.stream()>>>(
      static_cast<const bf16 *>(q.p), static_cast<const bf16 *>(k.p),
      static_cast<const bf16 *>(v.p), o, lse, T, H, static_cast<int>(heads), scale,
      causal);
  MAPP_CUDA_LAUNCHED();
}

template <int D>
void bwd(CudaBackend &be, DView dout, DView q, DView k, DView v, const float *lse,
         const float *delta, DView dq, DView dk, DView dv, int64_t B, int64_t T,
         int64_t H, int64_t heads, float scale, int causal) {
  constexpr int LD = D + 8, LS = BR + 8;
  size_t smem = (2 * BC + 2 * BR) * LD * 2 + BC * LS * 2 + 2 * BR * 4;
  static bool raised = false;
  if (!raised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        bwdKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = true;
  }
  // Deterministic: the kernel leaves dQ out (null accumulator) and
  // dqKernel forms it without atomics.
  const bool det = be.config().deterministic;
  int64_t n = B * T * H;
  float *acc = nullptr;
  if (!det) {
    acc = static_cast<float *>(be.scratch(n * 4, 4));
    MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, n * 4, be.stream()));
  }
  const bf16 *dO = static_cast<const bf16 *>(dout.p), *qp = static_cast<const bf16 *>(q.p),
             *kp = static_cast<const bf16 *>(k.p), *vp = static_cast<const bf16 *>(v.p);
  dim3 grid(static_cast<unsigned>((T + BC - 1) / BC), static_cast<unsigned>(B * heads));
  bwdKernel<D><<<grid, 256, smem, be.stream()>>>(dO, qp, kp, vp, lse, delta, acc, dk,
                                                 dv, T, H, static_cast<int>(heads),
                                                 scale, causal);
  MAPP_CUDA_LAUNCHED();
  if (!det) {
    scaleInto<<<gridFor(n, 256), 256, 0, be.stream()>>>(acc, dq, n, scale);
    MAPP_CUDA_LAUNCHED();
    return;
  }
  size_t dqSmem = (2 * BR + 4 * BC) * LD * 2;
  static bool dqRaised = false;
  if (!dqRaised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        dqKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dqSmem)));
    dqRaised = true;
  }
  dim3 qgrid(static_cast<unsigned>((T + BR - 1) / BR), static_cast<unsigned>(B * heads));
  dqKernel<D><<<qgrid, 128, dqSmem, be.stream()>>>(dO, qp, kp, vp, lse, delta, dq, T, H,
                                                   static_cast<int>(heads), scale, causal);
  MAPP_CUDA_LAUNCHED();
}

} // namespace

void cuda::flashForward(CudaBackend &be, DView q, DView k, DView v, DView o,
                        float *lse, int64_t B, int64_t T, int64_t H, int64_t heads,
                        int64_t D, float scale, int causal) {
  if (useWmma(be))
    return flashForwardWmma(be, q, k, v, o, lse, B, T, H, heads, D, scale, causal);
  if (D == 64)
    fwd<64>(be, q, k, v, o, lse, B, T, H, heads, scale, causal);
  else
    fwd<128>(be, q, k, v, o, lse, B, T, H, heads, scale, causal);
}

void cuda::flashBackward(CudaBackend &be, DView dout, DView q, DView k, DView v,
                         const float *lse, const float *delta, DView dq, DView dk,
                         DView dv, int64_t B, int64_t T, int64_t H, int64_t heads,
                         int64_t D, float scale, int causal) {
  if (useWmma(be)) {
    if (be.config().deterministic) // CudaConfig::fromEnv refuses this pair
      fail("MAPP_CUDA_DETERMINISTIC=1: the wmma attention backward adds dQ "
           "with float atomics");
    return flashBackwardWmma(be, dout, q, k, v, lse, delta, dq, dk, dv, B, T, H,
                             heads, D, scale, causal);
  }
  if (D == 64)
    bwd<64>(be, dout, q, k, v, lse, delta, dq, dk, dv, B, T, H, heads, scale, causal);
  else
    bwd<128>(be, dout, q, k, v, lse, delta, dq, dk, dv, B, T, H, heads, scale, causal);
}

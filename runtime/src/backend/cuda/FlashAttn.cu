//===- FlashAttn.cu - tensor-core flash attention (WMMA, bf16) ------------===//
//
// FlashAttention-2 structure on WMMA 16×16×16 bf16 fragments (HMMA on sm_90):
// forward: a block owns 64 query rows (4 warps × 16) and streams 64-key
// tiles of K and V through shared memory with an online softmax; the running
// output lives in shared memory in fp32 so each row can be rescaled.
// Backward: a block owns 64 keys, streams 64-query tiles, keeps dK and dV in
// shared fp32, and adds its dQ share into an fp32 accumulator with atomics.
// Causal blocks skip tiles above the diagonal; the forward starts with the
// longest rows so the tail of the grid is short.
//
//===----------------------------------------------------------------------===//
#include "Attention.h"

#include <mma.h>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
using namespace nvcuda;

namespace {

using bf16 = __nv_bfloat16;
constexpr int BR = 64, BC = 64, NW = 4, NT = NW * 32;
constexpr int LS = BC + 4; // fp32 score rows
constexpr int LP = BC + 8; // bf16 probability rows

template <int D> struct Lay {
  static constexpr int LD = D + 8; // bf16 operand rows
  static constexpr int LO = D + 4; // fp32 accumulator rows
  static constexpr int LW = (LS > LO ? LS : LO);
};

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAc = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

/// rows [t0, t0+64) × D of a [B,T,H] head slice into shared (zeros past T).
template <int D>
__device__ __forceinline__ void loadTile(bf16 *dst, const bf16 *base, int64_t H,
                                         int64_t t0, int64_t T) {
  constexpr int CH = D / 8; // 16-byte chunks per row
  for (int c = threadIdx.x; c < 64 * CH; c += NT) {
    int r = c / CH, cc = (c % CH) * 8;
    int64_t t = t0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (t < T)
      val = *reinterpret_cast<const uint4 *>(base + t * H + cc);
    *reinterpret_cast<uint4 *>(dst + r * Lay<D>::LD + cc) = val;
  }
}

template <int D>
__global__ void __launch_bounds__(NT)
    flashFwd(const bf16 *q, const bf16 *k, const bf16 *v, DView o, float *lse,
             int64_t T, int64_t H, int heads, float scale, int causal) {
  using L = Lay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sQ = reinterpret_cast<bf16 *>(smem);
  bf16 *sK = sQ + BR * L::LD;
  bf16 *sV = sK + BC * L::LD;
  float *sS = reinterpret_cast<float *>(sV + BC * L::LD); // [NW][16][LS]
  float *sO = sS + NW * 16 * LS;                           // [NW][16][LO]
  bf16 *sP = reinterpret_cast<bf16 *>(sO + NW * 16 * L::LO); // [NW][16][LP]

  int nQ = static_cast<int>((T + BR - 1) / BR);
  int qb = nQ - 1 - blockIdx.x;
  int64_t bh = blockIdx.y, b = bh / heads, hd = bh % heads;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  size_t headOff = static_cast<size_t>(b) * T * H + hd * D;
  const bf16 *qb0 = q + headOff, *kb0 = k + headOff, *vb0 = v + headOff;

  loadTile<D>(sQ, qb0, H, int64_t(qb) * BR, T);
  float *sSw = sS + warp * 16 * LS, *sOw = sO + warp * 16 * L::LO;
  bf16 *sPw = sP + warp * 16 * LP;
  for (int e = lane; e < 16 * L::LO; e += 32)
    sOw[e] = 0.0f;
  __syncthreads();
  FragA qf[D / 16];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wmma::load_matrix_sync(qf[kk], sQ + warp * 16 * L::LD + kk * 16, L::LD);

  const int r = lane >> 1, h = lane & 1;
  const int64_t qi = int64_t(qb) * BR + warp * 16 + r;
  const float sl2 = scale * 1.4426950408889634f; // exp(x) = exp2(x·log2 e)
  float m = -INFINITY, l = 0.0f;
  int nK = static_cast<int>((T + BC - 1) / BC);
  if (causal)
    nK = min(nK, qb + 1);
  for (int kt = 0; kt < nK; ++kt) {
    __syncthreads();
    loadTile<D>(sK, kb0, H, int64_t(kt) * BC, T);
    loadTile<D>(sV, vb0, H, int64_t(kt) * BC, T);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < BC / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragBc kf;
        wmma::load_matrix_sync(kf, sK + n * 16 * L::LD + kk * 16, L::LD);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(sSw + n * 16, acc, LS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax for row r, columns [h·32, h·32+32) of this tile (log2).
    float *srow = sSw + r * LS + h * 32;
    float mx = -INFINITY;
    bool diag = causal && kt == nK - 1;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      int64_t key = int64_t(kt) * BC + h * 32 + c;
      float s = srow[c] * sl2;
      if (key >= T || (diag && key > qi))
        s = -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    float mnew = fmaxf(m, mx);
    float corr = m == -INFINITY ? 0.0f : exp2f(m - mnew);
    float sum = 0.0f;
    bf16 *prow = sPw + r * LP + h * 32;
#pragma unroll 8
    for (int c = 0; c < 32; ++c) {
      float s = srow[c];
      float p = s == -INFINITY ? 0.0f : exp2f(s - mnew);
      sum += p;
      prow[c] = __float2bfloat16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = mnew;
    float *orow = sOw + r * L::LO + h * (D / 2);
#pragma unroll 8
    for (int c = 0; c < D / 2; ++c)
      orow[c] *= corr;
    __syncwarp();
    FragA pf[BC / 16];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
      wmma::load_matrix_sync(pf[kk], sPw + kk * 16, LP);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, sOw + n * 16, L::LO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        FragBr vf;
        wmma::load_matrix_sync(vf, sV + kk * 16 * L::LD + n * 16, L::LD);
        wmma::mma_sync(acc, pf[kk], vf, acc);
      }
      wmma::store_matrix_sync(sOw + n * 16, acc, L::LO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (qi < T) {
    float inv = l > 0 ? 1.0f / l : 0.0f;
    const float *orow = sOw + r * L::LO + h * (D / 2);
    int64_t base = (static_cast<int64_t>(b) * T + qi) * H + hd * D + h * (D / 2);
    for (int c = 0; c < D / 2; ++c)
      o.st(base + c, orow[c] * inv);
    if (h == 0)
      lse[bh * T + qi] =
          l > 0 ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
  }
}

template <int D>
__global__ void __launch_bounds__(NT)
    flashBwd(const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
             const float *lse, const float *delta, float *dqAcc, DView dk,
             DView dv, int64_t T, int64_t H, int heads, float scale,
             int causal) {
  using L = Lay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16 *sK = reinterpret_cast<bf16 *>(smem);
  bf16 *sV = sK + BC * L::LD;
  bf16 *sQ = sV + BC * L::LD;
  bf16 *sdO = sQ + BR * L::LD;
  bf16 *sPT = sdO + BR * L::LD;  // [64 keys][LP]
  bf16 *sdST = sPT + BC * LP;    // [64 keys][LP]
  float *sdK = reinterpret_cast<float *>(sdST + BC * LP); // [64][LO]
  float *sdV = sdK + BC * L::LO;
  float *sW = sdV + BC * L::LO; // [NW][16][LW]
  float *sLse = sW + NW * 16 * L::LW;
  float *sDelta = sLse + BR;

  int kb = blockIdx.x;
  int64_t bh = blockIdx.y, b = bh / heads, hd = bh % heads;
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  size_t headOff = static_cast<size_t>(b) * T * H + hd * D;
  loadTile<D>(sK, k + headOff, H, int64_t(kb) * BC, T);
  loadTile<D>(sV, v + headOff, H, int64_t(kb) * BC, T);
  for (int e = threadIdx.x; e < BC * L::LO; e += NT) {
    sdK[e] = 0.0f;
    sdV[e] = 0.0f;
  }
  float *sWw = sW + warp * 16 * L::LW;
  const int r = lane >> 1, h = lane & 1;
  const int64_t key = int64_t(kb) * BC + warp * 16 + r;
  const float sl2 = scale * 1.4426950408889634f;
  int nQ = static_cast<int>((T + BR - 1) / BR);
  for (int qt = causal ? kb : 0; qt < nQ; ++qt) {
    __syncthreads();
    loadTile<D>(sQ, q + headOff, H, int64_t(qt) * BR, T);
    loadTile<D>(sdO, dout + headOff, H, int64_t(qt) * BR, T);
    for (int i = threadIdx.x; i < BR; i += NT) {
      int64_t t = int64_t(qt) * BR + i;
      sLse[i] = t < T ? lse[bh * T + t] * 1.4426950408889634f : INFINITY;
      sDelta[i] = t < T ? delta[bh * T + t] : 0.0f;
    }
    __syncthreads();
    // Sᵀ_w = K_w·Qᵀ (16 keys × 64 queries).
#pragma unroll
    for (int n = 0; n < BR / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA kf;
        FragBc qf;
        wmma::load_matrix_sync(kf, sK + warp * 16 * L::LD + kk * 16, L::LD);
        wmma::load_matrix_sync(qf, sQ + n * 16 * L::LD + kk * 16, L::LD);
        wmma::mma_sync(acc, kf, qf, acc);
      }
      wmma::store_matrix_sync(sWw + n * 16, acc, L::LW, wmma::mem_row_major);
    }
    __syncwarp();
    float p[32];
    bool diag = causal && qt == kb;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      int64_t qi = int64_t(qt) * BR + h * 32 + c;
      float s = sWw[r * L::LW + h * 32 + c] * sl2;
      bool valid = qi < T && key < T && !(diag && key > qi);
      p[c] = valid ? exp2f(s - sLse[h * 32 + c]) : 0.0f;
      sPT[(warp * 16 + r) * LP + h * 32 + c] = __float2bfloat16(p[c]);
    }
    __syncwarp();
    // dV_w += Pᵀ_w·dO.
    {
      FragA pf[BR / 16];
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk)
        wmma::load_matrix_sync(pf[kk], sPT + warp * 16 * LP + kk * 16, LP);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragC acc;
        float *dst = sdV + warp * 16 * L::LO + n * 16;
        wmma::load_matrix_sync(acc, dst, L::LO, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
          FragBr of;
          wmma::load_matrix_sync(of, sdO + kk * 16 * L::LD + n * 16, L::LD);
          wmma::mma_sync(acc, pf[kk], of, acc);
        }
        wmma::store_matrix_sync(dst, acc, L::LO, wmma::mem_row_major);
      }
    }
    // dPᵀ_w = V_w·dOᵀ.
#pragma unroll
    for (int n = 0; n < BR / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA vf;
        FragBc of;
        wmma::load_matrix_sync(vf, sV + warp * 16 * L::LD + kk * 16, L::LD);
        wmma::load_matrix_sync(of, sdO + n * 16 * L::LD + kk * 16, L::LD);
        wmma::mma_sync(acc, vf, of, acc);
      }
      wmma::store_matrix_sync(sWw + n * 16, acc, L::LW, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      float dp = sWw[r * L::LW + h * 32 + c];
      sdST[(warp * 16 + r) * LP + h * 32 + c] =
          __float2bfloat16(p[c] * (dp - sDelta[h * 32 + c]));
    }
    __syncwarp();
    // dK_w += dSᵀ_w·Q.
    {
      FragA sf[BR / 16];
#pragma unroll
      for (int kk = 0; kk < BR / 16; ++kk)
        wmma::load_matrix_sync(sf[kk], sdST + warp * 16 * LP + kk * 16, LP);
#pragma unroll
      for (int n = 0; n < D / 16; ++n) {
        FragC acc;
        float *dst = sdK + warp * 16 * L::LO + n * 16;
        wmma::load_matrix_sync(acc, dst, L::LO, wmma::mem_row_major);
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk) {
          FragBr qf;
          wmma::load_matrix_sync(qf, sQ + kk * 16 * L::LD + n * 16, L::LD);
          wmma::mma_sync(acc, sf[kk], qf, acc);
        }
        wmma::store_matrix_sync(dst, acc, L::LO, wmma::mem_row_major);
      }
    }
    __syncthreads(); // every warp's dSᵀ rows are in sdST
    // dQ rows [w·16, w·16+16) of this query tile += dS·K (fp32 atomics).
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        FragAc sf; // dS = (dSᵀ)ᵀ: column-major view of sdST
        FragBr kf;
        wmma::load_matrix_sync(sf, sdST + kk * 16 * LP + warp * 16, LP);
        wmma::load_matrix_sync(kf, sK + kk * 16 * L::LD + n * 16, L::LD);
        wmma::mma_sync(acc, sf, kf, acc);
      }
      wmma::store_matrix_sync(sWw + n * 16, acc, L::LW, wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * D; e += 32) {
      int rr = e / D, c = e % D;
      int64_t qi = int64_t(qt) * BR + warp * 16 + rr;
      if (qi < T)
        atomicAdd(dqAcc + (static_cast<int64_t>(b) * T + qi) * H + hd * D + c,
                  sWw[rr * L::LW + c]);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < BC * D; e += NT) {
    int rr = e / D, c = e % D;
    int64_t t = int64_t(kb) * BC + rr;
    if (t < T) {
      int64_t idx = (static_cast<int64_t>(b) * T + t) * H + hd * D + c;
      dk.st(idx, sdK[rr * L::LO + c] * scale);
      dv.st(idx, sdV[rr * L::LO + c]);
    }
  }
}

__global__ void scaleInto(const float *src, DView dst, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst.st(i, src[i] * s);
}

template <int D> size_t fwdSmem() {
  using L = Lay<D>;
  return (BR + 2 * BC) * L::LD * 2 + NW * 16 * LS * 4 + NW * 16 * L::LO * 4 +
         NW * 16 * LP * 2;
}
template <int D> size_t bwdSmem() {
  using L = Lay<D>;
  return (2 * BC + 2 * BR) * L::LD * 2 + 2 * BC * LP * 2 + 2 * BC * L::LO * 4 +
         NW * 16 * L::LW * 4 + 2 * BR * 4;
}

template <int D>
void fwd(CudaBackend &be, DView q, DView k, DView v, DView o, float *lse,
         int64_t B, int64_t T, int64_t H, int64_t heads, float scale,
         int causal) {
  static bool raised = false;
  size_t smem = fwdSmem<D>();
  if (!raised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        flashFwd<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = true;
  }
  dim3 grid(static_cast<unsigned>((T + BR - 1) / BR),
            static_cast<unsigned>(B * heads));
  flashFwd<D><<<grid, NT, smem, be.stream()>>>(
      static_cast<const bf16 *>(q.p), static_cast<const bf16 *>(k.p),
      static_cast<const bf16 *>(v.p), o, lse, T, H, static_cast<int>(heads),
      scale, causal);
  MAPP_CUDA_LAUNCHED();
}

template <int D>
void bwd(CudaBackend &be, DView dout, DView q, DView k, DView v,
         const float *lse, const float *delta, DView dq, DView dk, DView dv,
         int64_t B, int64_t T, int64_t H, int64_t heads, float scale,
         int causal) {
  static bool raised = false;
  size_t smem = bwdSmem<D>();
  if (!raised) {
    MAPP_CUDA_CHECK(cudaFuncSetAttribute(
        flashBwd<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    raised = true;
  }
  int64_t n = B * T * H;
  float *acc = static_cast<float *>(be.scratch(n * 4, 4));
  MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, n * 4, be.stream()));
  dim3 grid(static_cast<unsigned>((T + BC - 1) / BC),
            static_cast<unsigned>(B * heads));
  flashBwd<D><<<grid, NT, smem, be.stream()>>>(
      static_cast<const bf16 *>(dout.p), static_cast<const bf16 *>(q.p),
      static_cast<const bf16 *>(k.p), static_cast<const bf16 *>(v.p), lse,
      delta, acc, dk, dv, T, H, static_cast<int>(heads), scale, causal);
  MAPP_CUDA_LAUNCHED();
  scaleInto<<<gridFor(n, 256), 256, 0, be.stream()>>>(acc, dq, n, scale);
  MAPP_CUDA_LAUNCHED();
}

} // namespace

bool cuda::flashSupported(int64_t D, DView q, DView k, DView v, DView x) {
  if (D != 64 && D != 128)
    return false;
  if (!q.bf16 || !k.bf16 || !v.bf16 || !x.bf16)
    return false;
  auto aligned = [](const void *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  };
  return aligned(q.p) && aligned(k.p) && aligned(v.p);
}

void cuda::flashForwardWmma(CudaBackend &be, DView q, DView k, DView v, DView o,
                        float *lse, int64_t B, int64_t T, int64_t H,
                        int64_t heads, int64_t D, float scale, int causal) {
  if (D == 64)
    fwd<64>(be, q, k, v, o, lse, B, T, H, heads, scale, causal);
  else
    fwd<128>(be, q, k, v, o, lse, B, T, H, heads, scale, causal);
}

void cuda::flashBackwardWmma(CudaBackend &be, DView dout, DView q, DView k, DView v,
                         const float *lse, const float *delta, DView dq,
                         DView dk, DView dv, int64_t B, int64_t T, int64_t H,
                         int64_t heads, int64_t D, float scale, int causal) {
  if (D == 64)
    bwd<64>(be, dout, q, k, v, lse, delta, dq, dk, dv, B, T, H, heads, scale,
            causal);
  else
    bwd<128>(be, dout, q, k, v, lse, delta, dq, dk, dv, B, T, H, heads, scale,
             causal);
}

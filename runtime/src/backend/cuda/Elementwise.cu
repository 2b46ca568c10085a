//===- Elementwise.cu - dropout, fill, data movement, reduce_sum ---------===//
//
// Memory-bound kernels; arithmetic is fp32 whatever the storage type (fp32
// or bf16, chosen by the backend's storage policy). The pointwise kernels
// (add, silu, ...) are generated (FusedKernels.cu).
//
//===----------------------------------------------------------------------===//
#include "../cpu/CpuKernels.h"
#include "CudaBackend.h"

#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;

__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

__global__ void dropoutKernel(DView x, DView o, int64_t n, uint64_t seed,
                              uint64_t step, double p, float keepScale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t r = splitmix(seed ^ splitmix(step ^ splitmix(uint64_t(i))));
    float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    o.st(i, static_cast<double>(u) >= p ? x.ld(i) * keepScale : 0.0f);
  }
}

template <typename T>
__global__ void fillKernel(T *p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

__global__ void convertKernel(const float *src, bf16 *dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

__global__ void copyConvertKernel(DView src, DView dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst.st(i, src.ld(i));
}

constexpr int kMaxRank = 8;
struct Strides {
  int rank;
  int64_t outDim[kMaxRank];
  int64_t srcStride[kMaxRank]; // input stride of the dim feeding output dim i
};

__global__ void permuteKernel(const void *x, void *y, int64_t n, Strides st,
                              int esize, DView xv, DView yv, int convert) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = o, src = 0;
    for (int i = st.rank - 1; i >= 0; --i) {
      int64_t c = rem % st.outDim[i];
      rem /= st.outDim[i];
      src += c * st.srcStride[i];
    }
    if (convert)
      yv.st(o, xv.ld(src));
    else if (esize == 2)
      static_cast<uint16_t *>(y)[o] = static_cast<const uint16_t *>(x)[src];
    else if (esize == 4)
      static_cast<uint32_t *>(y)[o] = static_cast<const uint32_t *>(x)[src];
    else
      static_cast<uint64_t *>(y)[o] = static_cast<const uint64_t *>(x)[src];
  }
}

/// y[o, j, i] = x[o, start + j, i] (slice), dims [outer, len, inner] of y
/// within x's [outer, full, inner]. With grad, the roles swap and positions
/// outside the window become zero.
__global__ void sliceKernel(DView src, DView dst, int64_t n, int64_t full,
                            int64_t len, int64_t inner, int64_t start,
                            int grad) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t in = i % inner, rest = i / inner;
    if (!grad) {
      int64_t j = rest % len, o = rest / len;
      dst.st(i, src.ld((o * full + start + j) * inner + in));
    } else {
      int64_t j = rest % full, o = rest / full;
      bool inside = j >= start && j < start + len;
      dst.st(i, inside ? src.ld((o * len + j - start) * inner + in) : 0.0f);
    }
  }
}

/// Column sums of x[R, C] over row chunks: partial[chunk][c].
__global__ void colSumPartial(DView x, int64_t R, int64_t C, int64_t rowsPer,
                              float *partial) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int64_t c = blockIdx.x * 32 + lane;
  int64_t r0 = blockIdx.y * rowsPer, r1 = min(R, r0 + rowsPer);
  float s = 0;
  if (c < C)
    for (int64_t r = r0 + w; r < r1; r += nw)
      s += x.ld(r * C + c);
  __shared__ float sh[32][33];
  sh[w][lane] = s;
  __syncthreads();
  if (w == 0 && c < C) {
    float t = 0;
    for (int i = 0; i < nw; ++i)
      t += sh[i][lane];
    partial[blockIdx.y * C + c] = t;
  }
}

__global__ void colSumFinal(const float *partial, int64_t chunks, int64_t C,
                            DView y) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x) {
    double s = 0;
    for (int64_t k = 0; k < chunks; ++k)
      s += partial[k * C + c];
    y.st(c, static_cast<float>(s));
  }
}

/// Row sums of x[R, C]: one warp per row.
__global__ void rowSum(DView x, int64_t R, int64_t C, DView y) {
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; r < R;
       r += warps) {
    float s = 0;
    for (int64_t c = lane; c < C; c += 32)
      s += x.ld(r * C + c);
    s = warpSum(s);
    if (lane == 0)
      y.st(r, s);
  }
}

struct ReduceGeom {
  int rank;
  int64_t dim[kMaxRank];
  int64_t stride[kMaxRank];
  int reduced[kMaxRank];
};

/// General reduce_sum: one thread per output element walks the reduced dims.
__global__ void reduceGeneral(DView x, DView y, int64_t nOut, int64_t nRed,
                              ReduceGeom g) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < nOut;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t base = 0, rem = o;
    for (int i = g.rank - 1; i >= 0; --i)
      if (!g.reduced[i]) {
        base += (rem % g.dim[i]) * g.stride[i];
        rem /= g.dim[i];
      }
    double s = 0;
    for (int64_t k = 0; k < nRed; ++k) {
      int64_t off = 0, r = k;
      for (int i = g.rank - 1; i >= 0; --i)
        if (g.reduced[i]) {
          off += (r % g.dim[i]) * g.stride[i];
          r /= g.dim[i];
        }
      s += x.ld(base + off);
    }
    y.st(o, static_cast<float>(s));
  }
}

/// y[o, start + j, i] = x[o, j, i]: input x of concat into its window of y.
__global__ void concatWindowKernel(DView x, DView y, int64_t n, int64_t len,
                                   int64_t full, int64_t inner, int64_t start) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t in = i % inner, rest = i / inner;
    int64_t j = rest % len, o = rest / len;
    y.st((o * full + start + j) * inner + in, x.ld(i));
  }
}

/// Up to kMaxConcat concat inputs, passed by value: input i fills columns
/// [col[i], col[i + 1]) of each output row.
constexpr int kMaxConcat = 8;
struct ConcatInputs {
  DView in[kMaxConcat];
  int col[kMaxConcat + 1];
};

/// One launch writes every output element once, 8 at a time: each thread
/// finds the input whose window holds its 8 columns (windows are multiples
/// of 8, so none straddles two inputs).
template <typename Td>
__global__ void concatVecKernel(ConcatInputs cat, void *dst, int64_t rows,
                                int F) {
  int W = F / 8;
  int64_t total = rows * W;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = idx / W;
    int c = static_cast<int>(idx - r * W) * 8;
    int i = 0;
    while (c >= cat.col[i + 1])
      ++i;
    int L = cat.col[i + 1] - cat.col[i];
    float v[8];
    cat.in[i].ld8(r * L + c - cat.col[i], v);
    store8<Td>(dst, r * F + c, v);
  }
}

/// Row-wise window copy over `rows` rows: slice (grad = 0) reads a window
/// [off, off+L) of source rows of F elements into rows of L; slice_grad
/// (grad = 1) writes rows of F with the window from rows of L and zeros
/// elsewhere. 8 elements per thread; L, F, off multiples of 8.
template <typename Ts, typename Td>
__global__ void windowVecKernel(const void *src, void *dst, int64_t rows,
                                int F, int L, int off, int grad) {
  int W = (grad ? F : L) / 8;
  int64_t total = rows * W;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = idx / W;
    int c = static_cast<int>(idx - r * W) * 8;
    float v[8];
    if (!grad) {
      load8<Ts>(src, r * F + off + c, v);
      store8<Td>(dst, r * L + c, v);
    } else {
      if (c >= off && c < off + L)
        load8<Ts>(src, r * L + c - off, v);
      else
#pragma unroll
        for (int j = 0; j < 8; ++j)
          v[j] = 0.0f;
      store8<Td>(dst, r * F + c, v);
    }
  }
}

bool windowVec(DView src, DView dst, int64_t rows, int64_t F, int64_t L,
               int64_t off, int grad, cudaStream_t s) {
  if (F % 8 || L % 8 || off % 8 || F > INT32_MAX || !aligned16(src.p) ||
      !aligned16(dst.p))
    return false;
  int64_t n = rows * ((grad ? F : L) / 8);
  int g = gridFor(n, kThreads);
  int f = static_cast<int>(F), l = static_cast<int>(L), o = static_cast<int>(off);
  if (src.bf16 && dst.bf16)
    windowVecKernel<bf16, bf16><<<g, kThreads, 0, s>>>(src.p, dst.p, rows, f, l, o, grad);
  else if (src.bf16)
    windowVecKernel<bf16, float><<<g, kThreads, 0, s>>>(src.p, dst.p, rows, f, l, o, grad);
  else if (dst.bf16)
    windowVecKernel<float, bf16><<<g, kThreads, 0, s>>>(src.p, dst.p, rows, f, l, o, grad);
  else
    windowVecKernel<float, float><<<g, kThreads, 0, s>>>(src.p, dst.p, rows, f, l, o, grad);
  MAPP_CUDA_LAUNCHED();
  return true;
}

int64_t normDim(int64_t d, int rank) { return d < 0 ? d + rank : d; }
int64_t span(const Shape &s, int64_t from, int64_t to) {
  int64_t n = 1;
  for (int64_t i = from; i < to; ++i)
    n *= s[i];
  return n;
}

} // namespace

void cuda::convertToBf16(const float *src, bf16 *dst, int64_t n, cudaStream_t s) {
  if (!n)
    return;
  convertKernel<<<gridFor(n, kThreads), kThreads, 0, s>>>(src, dst, n);
  MAPP_CUDA_LAUNCHED();
}

void cuda::copyConvert(DView src, DView dst, int64_t n, cudaStream_t s) {
  if (!n)
    return;
  if (src.bf16 == dst.bf16) {
    if (src.p != dst.p)
      MAPP_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, n * (src.bf16 ? 2 : 4),
                                      cudaMemcpyDeviceToDevice, s));
    return;
  }
  copyConvertKernel<<<gridFor(n, kThreads), kThreads, 0, s>>>(src, dst, n);
  MAPP_CUDA_LAUNCHED();
}

void cuda::fillZero(DView dst, int64_t n, cudaStream_t s) {
  if (n)
    MAPP_CUDA_CHECK(cudaMemsetAsync(dst.p, 0, n * (dst.bf16 ? 2 : 4), s));
}

void cuda::dropout(const KernelArgs &a) {
  cudaStream_t s = backendOf(a).stream();
  double p = a.attrs.getFloat("p", 0);
  int64_t n = a.out[0].numel();
  if (p == 0) {
    copyConvert(view(a.in[0]), view(a.out[0]), n, s);
    return;
  }
  if (!n)
    return;
  uint64_t seed = static_cast<uint64_t>(a.attrs.getInt("seed", 0));
  float keepScale = static_cast<float>(1.0 / (1.0 - p));
  dropoutKernel<<<gridFor(n, kThreads), kThreads, 0, s>>>(
      view(a.in[0]), view(a.out[0]), n, seed, static_cast<uint64_t>(a.ctx.step),
      p, keepScale);
  MAPP_CUDA_LAUNCHED();
}
void cuda::dropout_grad(const KernelArgs &a) { dropout(a); }

void cuda::fill(const KernelArgs &a) {
  cudaStream_t s = backendOf(a).stream();
  const Tensor &o = a.out[0];
  int64_t n = o.numel();
  if (!n)
    return;
  double v = a.attrs.getFloat("value", 0);
  int g = gridFor(n, kThreads);
  if (o.type.dtype == DType::I32)
    fillKernel<int32_t><<<g, kThreads, 0, s>>>(o.i32(), n, static_cast<int32_t>(v));
  else if (isBf16(o))
    fillKernel<bf16><<<g, kThreads, 0, s>>>(static_cast<bf16 *>(o.data), n,
                                            __float2bfloat16(static_cast<float>(v)));
  else
    fillKernel<float><<<g, kThreads, 0, s>>>(o.f32(), n, static_cast<float>(v));
  MAPP_CUDA_LAUNCHED();
}

void cuda::reshape(const KernelArgs &a) {
  const Tensor &x = a.in[0], &y = a.out[0];
  if (a.attrs.getInt("alias", 0)) {
    // A view of x: bindProgram gave both the same storage type, so there is
    // nothing to copy (a dtype mismatch here would be a backend bug).
    if (x.type.dtype != y.type.dtype || x.data != y.data)
      fail("reshape: an alias's input and output differ in ",
           x.type.dtype != y.type.dtype ? "storage dtype" : "address");
    return;
  }
  cudaStream_t s = backendOf(a).stream();
  if (x.type.dtype == y.type.dtype) {
    if (x.data != y.data && x.numel())
      MAPP_CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, x.numel() * storedSize(x),
                                      cudaMemcpyDeviceToDevice, s));
    return;
  }
  copyConvert(view(x), view(y), x.numel(), s);
}

void cuda::transpose(const KernelArgs &a) {
  std::vector<int64_t> perm = a.attrs.getInts("perm");
  const Tensor &x = a.in[0], &y = a.out[0];
  int r = x.rank();
  if (r > kMaxRank)
    fail("transpose: rank ", r, " exceeds the CUDA backend's ", kMaxRank);
  int64_t n = x.numel();
  if (!n)
    return;
  Strides st{};
  st.rank = r;
  std::vector<int64_t> inStride(r, 1);
  for (int i = r - 2; i >= 0; --i)
    inStride[i] = inStride[i + 1] * x.dim(i + 1);
  for (int i = 0; i < r; ++i) {
    st.outDim[i] = x.dim(static_cast<int>(perm[i]));
    st.srcStride[i] = inStride[perm[i]];
  }
  bool floats = x.type.dtype == DType::F32 || x.type.dtype == DType::BF16;
  int convert = floats && x.type.dtype != y.type.dtype;
  cudaStream_t s = backendOf(a).stream();
  permuteKernel<<<gridFor(n, kThreads), kThreads, 0, s>>>(
      x.data, y.data, n, st, static_cast<int>(storedSize(x)), view(x), view(y),
      convert);
  MAPP_CUDA_LAUNCHED();
}

void cuda::slice(const KernelArgs &a) {
  const Shape &s = a.in[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.in[0].rank());
  int64_t start = a.attrs.getInt("start", 0), len = a.out[0].shape()[d];
  int64_t inner = span(s, d + 1, s.size()), n = a.out[0].numel();
  if (!n)
    return;
  if (windowVec(view(a.in[0]), view(a.out[0]), span(s, 0, d), s[d] * inner,
                len * inner, start * inner, 0, backendOf(a).stream()))
    return;
  sliceKernel<<<gridFor(n, kThreads), kThreads, 0, backendOf(a).stream()>>>(
      view(a.in[0]), view(a.out[0]), n, s[d], len, inner, start, 0);
  MAPP_CUDA_LAUNCHED();
}

void cuda::slice_grad(const KernelArgs &a) {
  const Shape &s = a.out[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.out[0].rank());
  int64_t start = a.attrs.getInt("start", 0), len = a.in[0].shape()[d];
  int64_t inner = span(s, d + 1, s.size()), n = a.out[0].numel();
  if (!n)
    return;
  if (windowVec(view(a.in[0]), view(a.out[0]), span(s, 0, d), s[d] * inner,
                len * inner, start * inner, 1, backendOf(a).stream()))
    return;
  sliceKernel<<<gridFor(n, kThreads), kThreads, 0, backendOf(a).stream()>>>(
      view(a.in[0]), view(a.out[0]), n, s[d], len, inner, start, 1);
  MAPP_CUDA_LAUNCHED();
}

/// concat as one vectorized pass when every window is a multiple of 8
/// elements of 16-byte-aligned storage; false leaves it to the generic path.
static bool concatVec(const KernelArgs &a, int64_t rows, int64_t F,
                      int64_t inner, int64_t d, cudaStream_t st) {
  DView y = view(a.out[0]);
  if (a.numIn > kMaxConcat || F % 8 || F > INT32_MAX || !aligned16(y.p))
    return false;
  ConcatInputs cat{};
  for (int i = 0; i < a.numIn; ++i) {
    int64_t w = a.in[i].shape()[d] * inner;
    cat.in[i] = view(a.in[i]);
    if (w % 8 || (w && !aligned16(cat.in[i].p)))
      return false;
    cat.col[i + 1] = cat.col[i] + static_cast<int>(w);
  }
  int g = gridFor(rows * (F / 8), kThreads);
  if (y.bf16)
    concatVecKernel<bf16><<<g, kThreads, 0, st>>>(cat, y.p, rows, int(F));
  else
    concatVecKernel<float><<<g, kThreads, 0, st>>>(cat, y.p, rows, int(F));
  MAPP_CUDA_LAUNCHED();
  return true;
}

void cuda::concat(const KernelArgs &a) {
  // Each input fills its window [start, start + len) of y along `dim`.
  const Shape &s = a.out[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.out[0].rank());
  int64_t inner = span(s, d + 1, s.size());
  cudaStream_t st = backendOf(a).stream();
  if (!a.out[0].numel() ||
      concatVec(a, span(s, 0, d), s[d] * inner, inner, d, st))
    return;
  int64_t start = 0;
  for (int i = 0; i < a.numIn; ++i) {
    int64_t len = a.in[i].shape()[d], n = a.in[i].numel();
    if (n) {
      concatWindowKernel<<<gridFor(n, kThreads), kThreads, 0, st>>>(
          view(a.in[i]), view(a.out[0]), n, len, s[d], inner, start);
      MAPP_CUDA_LAUNCHED();
    }
    start += len;
  }
}

void cuda::reduce_sum(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Shape &s = a.in[0].shape();
  std::vector<int64_t> dims = a.attrs.getInts("dims");
  int r = static_cast<int>(s.size());
  int64_t nOut = a.out[0].numel(), nIn = a.in[0].numel();
  if (!nOut)
    return;
  if (!nIn) {
    fillZero(view(a.out[0]), nOut, be.stream());
    return;
  }
  bool prefix = !dims.empty(), suffix = !dims.empty();
  for (size_t i = 0; i < dims.size(); ++i) {
    prefix &= dims[i] == static_cast<int64_t>(i);
    suffix &= dims[i] == static_cast<int64_t>(r - dims.size() + i);
  }
  if (dims.empty()) {
    copyConvert(view(a.in[0]), view(a.out[0]), nIn, be.stream());
    return;
  }
  if (prefix) {
    int64_t C = nOut, R = nIn / C;
    int64_t rowsPer = std::max<int64_t>(64, (R + 63) / 64);
    int64_t chunks = (R + rowsPer - 1) / rowsPer;
    float *partial = static_cast<float *>(be.scratch(chunks * C * 4, 2));
    dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
    colSumPartial<<<grid, 256, 0, be.stream()>>>(view(a.in[0]), R, C, rowsPer,
                                                 partial);
    MAPP_CUDA_LAUNCHED();
    colSumFinal<<<gridFor(C, kThreads), kThreads, 0, be.stream()>>>(
        partial, chunks, C, view(a.out[0]));
    MAPP_CUDA_LAUNCHED();
    return;
  }
  if (suffix) {
    int64_t R = nOut, C = nIn / R;
    rowSum<<<gridFor(R * 32, kThreads), kThreads, 0, be.stream()>>>(
        view(a.in[0]), R, C, view(a.out[0]));
    MAPP_CUDA_LAUNCHED();
    return;
  }
  if (r > kMaxRank)
    fail("reduce_sum: rank ", r, " exceeds the CUDA backend's ", kMaxRank);
  ReduceGeom g{};
  g.rank = r;
  int64_t st = 1, nRed = 1;
  for (int i = r - 1; i >= 0; --i) {
    g.dim[i] = s[i];
    g.stride[i] = st;
    st *= s[i];
  }
  for (int64_t d : dims) {
    g.reduced[d] = 1;
    nRed *= s[d];
  }
  reduceGeneral<<<gridFor(nOut, kThreads), kThreads, 0, be.stream()>>>(
      view(a.in[0]), view(a.out[0]), nOut, nRed, g);
  MAPP_CUDA_LAUNCHED();
}

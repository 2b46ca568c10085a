//===- Shape.cpp - data movement and reduce_sum ---------------------------===//
#include "CpuKernels.h"

#include <cstring>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

/// Product of dims [from, to).
int64_t span(const Shape &s, int64_t from, int64_t to) {
  int64_t n = 1;
  for (int64_t i = from; i < to; ++i)
    n *= s[i];
  return n;
}

int64_t normDim(int64_t d, int rank) { return d < 0 ? d + rank : d; }

template <typename T>
void permute(const T *x, T *y, const Shape &in,
             const std::vector<int64_t> &perm) {
  int r = static_cast<int>(in.size());
  std::vector<int64_t> inStride(r, 1), outShape(r), stride(r);
  for (int i = r - 2; i >= 0; --i)
    inStride[i] = inStride[i + 1] * in[i + 1];
  for (int i = 0; i < r; ++i) {
    outShape[i] = in[perm[i]];
    stride[i] = inStride[perm[i]];
  }
  int64_t n = numel(in);
  std::vector<int64_t> idx(r, 0);
  int64_t src = 0;
  for (int64_t o = 0; o < n; ++o) {
    y[o] = x[src];
    // Odometer over the output index; src follows through the strides.
    for (int i = r - 1; i >= 0; --i) {
      src += stride[i];
      if (++idx[i] < outShape[i])
        break;
      src -= stride[i] * outShape[i];
      idx[i] = 0;
    }
  }
}

} // namespace

void cpu::reshape(const KernelArgs &a) {
  // An alias (the plan verifier checked: same storage) has nothing to copy.
  if (a.attrs.getInt("alias", 0))
    return;
  if (a.out[0].data != a.in[0].data)
    std::memmove(a.out[0].data, a.in[0].data,
                 a.in[0].numel() * dtypeSize(a.in[0].type.dtype));
}

void cpu::transpose(const KernelArgs &a) {
  std::vector<int64_t> perm = a.attrs.getInts("perm");
  const Tensor &x = a.in[0];
  switch (dtypeSize(x.type.dtype)) {
  case 2:
    return permute(static_cast<const uint16_t *>(x.data),
                   static_cast<uint16_t *>(a.out[0].data), x.shape(), perm);
  case 4:
    return permute(static_cast<const uint32_t *>(x.data),
                   static_cast<uint32_t *>(a.out[0].data), x.shape(), perm);
  default:
    return permute(static_cast<const uint64_t *>(x.data),
                   static_cast<uint64_t *>(a.out[0].data), x.shape(), perm);
  }
}

void cpu::slice(const KernelArgs &a) {
  const Shape &s = a.in[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.in[0].rank());
  int64_t start = a.attrs.getInt("start", 0), len = a.out[0].shape()[d];
  int64_t outer = span(s, 0, d), inner = span(s, d + 1, s.size());
  const float *x = a.in[0].f32();
  float *y = a.out[0].f32();
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(y + o * len * inner, x + (o * s[d] + start) * inner,
                len * inner * sizeof(float));
}

void cpu::slice_grad(const KernelArgs &a) {
  const Shape &s = a.out[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.out[0].rank());
  int64_t start = a.attrs.getInt("start", 0), len = a.in[0].shape()[d];
  int64_t outer = span(s, 0, d), inner = span(s, d + 1, s.size());
  const float *dy = a.in[0].f32();
  float *dx = a.out[0].f32();
  std::memset(dx, 0, a.out[0].numel() * sizeof(float));
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dx + (o * s[d] + start) * inner, dy + o * len * inner,
                len * inner * sizeof(float));
}

void cpu::concat(const KernelArgs &a) {
  const Shape &s = a.out[0].shape();
  int64_t d = normDim(a.attrs.getInt("dim", 0), a.out[0].rank());
  int64_t outer = span(s, 0, d), inner = span(s, d + 1, s.size());
  float *y = a.out[0].f32();
  for (int64_t o = 0; o < outer; ++o) {
    float *dst = y + o * s[d] * inner;
    for (int i = 0; i < a.numIn; ++i) {
      int64_t chunk = a.in[i].shape()[d] * inner;
      std::memcpy(dst, a.in[i].f32() + o * chunk, chunk * sizeof(float));
      dst += chunk;
    }
  }
}

void cpu::reduce_sum(const KernelArgs &a) {
  const Shape &s = a.in[0].shape();
  std::vector<int64_t> dims = a.attrs.getInts("dims");
  int r = static_cast<int>(s.size());
  std::vector<bool> reduced(r, false);
  for (int64_t d : dims)
    reduced[d] = true;
  // Output stride of each input dim (0 for reduced dims).
  std::vector<int64_t> ostride(r, 0);
  int64_t acc = 1;
  for (int i = r - 1; i >= 0; --i)
    if (!reduced[i]) {
      ostride[i] = acc;
      acc *= s[i];
    }
  std::vector<double> sum(a.out[0].numel(), 0.0);
  const float *x = a.in[0].f32();
  int64_t n = a.in[0].numel();
  std::vector<int64_t> idx(r, 0);
  int64_t dst = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum[dst] += x[i];
    for (int k = r - 1; k >= 0; --k) {
      dst += ostride[k];
      if (++idx[k] < s[k])
        break;
      dst -= ostride[k] * s[k];
      idx[k] = 0;
    }
  }
  float *y = a.out[0].f32();
  for (size_t i = 0; i < sum.size(); ++i)
    y[i] = static_cast<float>(sum[i]);
}

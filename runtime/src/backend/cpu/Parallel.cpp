//===- Parallel.cpp - kernels of tensor / data parallelism ----------------===//
//
// Vocab-parallel cross-entropy pieces (reduce_max, vocab_ce_partials,
// ce_from_partials and their gradients), Megatron's copy_to_group (f) and
// scatter_to_group, and the data-parallel bucket kernels grad_sync and
// param_gather (docs/semantics.md, docs/plan-lowering.md).
//
//===----------------------------------------------------------------------===//
#include "CpuKernels.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cpu;

namespace {

CommGroup groupOfKernel(const KernelArgs &a, const char *kernel) {
  if (!a.ctx.comm)
    fail(kernel, ": no communicator attached");
  std::vector<int64_t> ranks;
  if (a.attrs.has("ranks"))
    ranks = a.attrs.getInts("ranks");
  return resolveGroup(*a.ctx.comm, a.attrs.getStr("group", "tp"), ranks);
}

} // namespace

/// (index of this rank in the kernel's `group`, group size); (0, 1) without
/// a communicator, so single-rank checks of the pure kernels work.
std::pair<int, int> cpu::groupPosition(const KernelArgs &a) {
  if (!a.ctx.comm || !a.attrs.has("group"))
    return {0, 1};
  CommGroup g = resolveGroup(*a.ctx.comm, a.attrs.getStr("group", "tp"), {});
  return {g.indexOf(a.ctx.comm->rank()), g.size()};
}

void cpu::reduce_max(const KernelArgs &a) {
  const Shape &s = a.in[0].shape();
  std::vector<int64_t> dims = a.attrs.getInts("dims");
  int r = static_cast<int>(s.size());
  std::vector<bool> reduced(r, false);
  for (int64_t d : dims)
    reduced[d < 0 ? d + r : d] = true;
  std::vector<int64_t> ostride(r, 0);
  int64_t acc = 1;
  for (int i = r - 1; i >= 0; --i)
    if (!reduced[i]) {
      ostride[i] = acc;
      acc *= s[i];
    }
  float *y = a.out[0].f32();
  std::fill(y, y + a.out[0].numel(), -std::numeric_limits<float>::infinity());
  const float *x = a.in[0].f32();
  int64_t n = a.in[0].numel();
  std::vector<int64_t> idx(r, 0);
  int64_t dst = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[dst] = std::max(y[dst], x[i]);
    for (int k = r - 1; k >= 0; --k) {
      dst += ostride[k];
      if (++idx[k] < s[k])
        break;
      dst -= ostride[k] * s[k];
      idx[k] = 0;
    }
  }
}

void cpu::vocab_ce_partials(const KernelArgs &a) {
  const float *x = a.in[0].f32(), *m = a.in[2].f32();
  const int32_t *t = a.in[1].i32();
  float *p = a.out[0].f32();
  int64_t v = a.in[0].dim(-1), rows = rowsOf(a.in[0]);
  int64_t lo = static_cast<int64_t>(groupPosition(a).first) * v;
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float *xr = x + r * v;
      double mx = m[r], s = 0;
      for (int64_t c = 0; c < v; ++c)
        s += std::exp(static_cast<double>(xr[c]) - mx);
      int64_t local = static_cast<int64_t>(t[r]) - lo;
      p[2 * r] = static_cast<float>(s);
      p[2 * r + 1] = local >= 0 && local < v
                         ? static_cast<float>(xr[local] - mx)
                         : 0.0f;
    }
  });
}

void cpu::vocab_ce_partials_grad(const KernelArgs &a) {
  const float *dp = a.in[0].f32(), *x = a.in[1].f32(), *m = a.in[3].f32();
  const int32_t *t = a.in[2].i32();
  float *dx = a.out[0].f32();
  int64_t v = a.in[1].dim(-1), rows = rowsOf(a.in[1]);
  int64_t lo = static_cast<int64_t>(groupPosition(a).first) * v;
  parFor(a, rows, 8, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      const float *xr = x + r * v;
      float *dr = dx + r * v;
      double d0 = dp[2 * r], mx = m[r];
      for (int64_t c = 0; c < v; ++c)
        dr[c] = static_cast<float>(d0 * std::exp(static_cast<double>(xr[c]) - mx));
      int64_t local = static_cast<int64_t>(t[r]) - lo;
      if (local >= 0 && local < v)
        dr[local] = static_cast<float>(
            d0 * std::exp(static_cast<double>(xr[local]) - mx) + dp[2 * r + 1]);
    }
  });
}

void cpu::ce_from_partials(const KernelArgs &a) {
  const float *p = a.in[0].f32();
  const int32_t *t = a.in[1].i32();
  int64_t rows = a.in[0].numel() / 2;
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  double sum = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    if (t[r] != ignore) {
      sum += std::log(static_cast<double>(p[2 * r])) - p[2 * r + 1];
      ++count;
    }
  a.out[0].f32()[0] = static_cast<float>(
      count ? sum / count : std::numeric_limits<double>::quiet_NaN());
}

void cpu::ce_from_partials_grad(const KernelArgs &a) {
  float dloss = a.in[0].f32()[0];
  const float *p = a.in[1].f32();
  const int32_t *t = a.in[2].i32();
  float *dp = a.out[0].f32();
  int64_t rows = a.in[1].numel() / 2;
  int64_t ignore = a.attrs.getInt("ignore_index", -100);
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r)
    count += t[r] != ignore;
  double coef = count ? static_cast<double>(dloss) / count : 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    bool keep = t[r] != ignore;
    dp[2 * r] = keep ? static_cast<float>(coef / p[2 * r]) : 0.0f;
    dp[2 * r + 1] = keep ? static_cast<float>(-coef) : 0.0f;
  }
}

void cpu::copy_to_group(const KernelArgs &a) {
  if (a.out[0].data != a.in[0].data)
    std::memmove(a.out[0].data, a.in[0].data, a.in[0].numel() * sizeof(float));
}

// y = slice r (of g) of x along dim.
void cpu::scatter_to_group(const KernelArgs &a) {
  auto [r, g] = groupPosition(a);
  const Tensor &x = a.in[0], &y = a.out[0];
  int rank = x.rank();
  int64_t d = a.attrs.getInt("dim", 0);
  if (d < 0)
    d += rank;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i)
    outer *= x.dim(i);
  for (int i = static_cast<int>(d) + 1; i < rank; ++i)
    inner *= x.dim(i);
  int64_t full = x.dim(static_cast<int>(d)), len = full / g;
  if (len * g != full || y.dim(static_cast<int>(d)) != len)
    fail("scatter_to_group: dim ", d, " of ", shapeStr(x.shape()),
         " does not split into ", g, " slices of ",
         shapeStr(y.shape()));
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(y.f32() + o * len * inner,
                x.f32() + (o * full + r * len) * inner,
                len * inner * sizeof(float));
}

namespace {

/// The flat bucket of the operands (gradient or parameter buffers, in list
/// order), zero-padded to a multiple of the group size.
int64_t bucketSize(const KernelArgs &a, int g) {
  int64_t n = 0;
  for (int i = 0; i < a.numIn; ++i)
    n += a.in[i].numel();
  return (n + g - 1) / g * g;
}

void pack(const KernelArgs &a, std::vector<float> &flat) {
  int64_t off = 0;
  for (int i = 0; i < a.numIn; ++i) {
    std::memcpy(flat.data() + off, a.in[i].f32(),
                a.in[i].numel() * sizeof(float));
    off += a.in[i].numel();
  }
}

/// Writes flat[lo, hi) back into the operands it came from.
void unpack(const KernelArgs &a, const std::vector<float> &flat, int64_t lo,
            int64_t hi) {
  int64_t off = 0;
  for (int i = 0; i < a.numIn; ++i) {
    int64_t n = a.in[i].numel();
    int64_t b = std::max(lo, off), e = std::min(hi, off + n);
    if (b < e)
      std::memcpy(a.in[i].f32() + (b - off), flat.data() + b,
                  (e - b) * sizeof(float));
    off += n;
  }
}

} // namespace

// Gradient buffers are final only on the step's last microbatch.
void cpu::grad_sync(const KernelArgs &a) {
  if (a.ctx.microbatch != a.ctx.numMicrobatches - 1)
    return;
  CommGroup g = groupOfKernel(a, "grad_sync");
  if (g.size() == 1)
    return;
  std::string red = a.attrs.getStr("reduction", "avg");
  ReduceOp op;
  if (!parseReduceOp(red, op))
    fail("grad_sync: unknown reduction '", red, "'");
  std::string mode = a.attrs.getStr("mode", "all_reduce");
  if (mode != "all_reduce" && mode != "reduce_scatter")
    fail("grad_sync: unknown mode '", mode, "'");
  int64_t n = bucketSize(a, g.size());
  std::vector<float> flat(n, 0.0f);
  pack(a, flat);
  if (mode == "all_reduce") {
    a.ctx.comm->allReduce(flat.data(), n, op, g);
    unpack(a, flat, 0, n);
    return;
  }
  // ZeRO-1: only this rank's slice of the bucket is reduced; the rest of
  // its gradient buffers stays unreduced (the sharded update and the
  // executor's norm read only the slice).
  int64_t chunk = n / g.size(), r = g.indexOf(a.ctx.comm->rank());
  std::vector<float> mine(chunk);
  a.ctx.comm->reduceScatter(flat.data(), mine.data(), chunk, op, g);
  std::memcpy(flat.data() + r * chunk, mine.data(), chunk * sizeof(float));
  unpack(a, flat, r * chunk, (r + 1) * chunk);
}

// ZeRO-1: every member contributes its updated slice of the flat bucket.
void cpu::param_gather(const KernelArgs &a) {
  CommGroup g = groupOfKernel(a, "param_gather");
  if (g.size() == 1)
    return;
  int64_t n = bucketSize(a, g.size()), chunk = n / g.size();
  int r = g.indexOf(a.ctx.comm->rank());
  std::vector<float> flat(n, 0.0f), full(n);
  pack(a, flat);
  a.ctx.comm->allGather(flat.data() + r * chunk, full.data(), chunk, g);
  unpack(a, full, 0, n);
}

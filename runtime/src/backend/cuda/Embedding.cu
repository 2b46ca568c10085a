//===- Embedding.cu - embedding lookup and its deterministic gradient -----===//
//
// The gradient sums the rows of dy that share a token id. By default with
// float atomics, in whatever order the blocks run (a different rounding
// each run); under MAPP_CUDA_DETERMINISTIC=1 the ids are sorted instead: a stable radix sort of
// (local row, position) pairs (CUB), then one block per distinct row adds
// its positions' rows in a fixed order. Same sums, fixed order: the
// gradient is bit-identical run to run.
//
//===----------------------------------------------------------------------===//
#include "../cpu/CpuKernels.h"
#include "CudaBackend.h"

#include <cub/device/device_radix_sort.cuh>

#include <climits>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

// With a `group`, the table holds rows [lo, lo + v) of a vocabulary of
// `total` rows (vocab-parallel): other valid ids give zero rows (embedding)
// or contribute nothing (grad), as on the CPU.
__global__ void embeddingKernel(DView table, const int32_t *ids, DView y,
                                int64_t v, int64_t lo, int64_t total,
                                int64_t h, int64_t n, DeviceError *err) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    int32_t id = ids[r];
    if ((id < 0 || id >= total) && threadIdx.x == 0)
      reportError(err, kErrEmbeddingId, id, r, total);
    int64_t row = int64_t(id) - lo;
    bool mine = row >= 0 && row < v;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
      y.st(r * h + c, mine ? table.ld(row * h + c) : 0.0f);
  }
}

/// The default gradient: every position adds its dy row into its table
/// row with float atomics (repeated ids collide in whatever order the
/// blocks run: the last bits differ run to run).
__global__ void embeddingGradAtomic(DView dy, const int32_t *ids, float *dt,
                                    int64_t v, int64_t lo, int64_t total,
                                    int64_t h, int64_t n, DeviceError *err) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    int32_t id = ids[r];
    if (id < 0 || id >= total) {
      if (threadIdx.x == 0)
        reportError(err, kErrEmbeddingGradId, id, r, total);
      continue;
    }
    int64_t row = int64_t(id) - lo;
    if (row < 0 || row >= v)
      continue;
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
      atomicAdd(dt + row * h + c, dy.ld(r * h + c));
  }
}

/// Sort keys: the id's row of this table, or v for ids that contribute
/// nothing (another rank's rows; an invalid id, reported here).
__global__ void embeddingGradKeys(const int32_t *ids, int32_t *keys,
                                  int32_t *pos, int64_t v, int64_t lo,
                                  int64_t total, int64_t n, DeviceError *err) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < n;
       r += int64_t(gridDim.x) * blockDim.x) {
    int32_t id = ids[r];
    int64_t row = int64_t(id) - lo;
    if (id < 0 || id >= total) {
      reportError(err, kErrEmbeddingGradId, id, r, total);
      row = v;
    } else if (row < 0 || row >= v) {
      row = v;
    }
    keys[r] = static_cast<int32_t>(row);
    pos[r] = static_cast<int32_t>(r);
  }
}

/// The block at the first position of each run of equal sorted keys sums
/// the run's dy rows (in position order: the sort is stable) into its row,
/// one column a thread (blocks along y take further columns). Four
/// interleaved partial sums keep four loads in flight (a frequent token's
/// run can be thousands of rows); their order is fixed too.
__global__ void embeddingGradRuns(DView dy, const int32_t *keys,
                                  const int32_t *pos, float *dt, int64_t v,
                                  int64_t h, int64_t n) {
  int64_t c = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    int32_t key = keys[i];
    if (key == v || (i > 0 && keys[i - 1] == key))
      continue;
    int64_t end = i + 1;
    while (end < n && keys[end] == key)
      ++end;
    if (c >= h)
      continue;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t j = i;
    for (; j + 4 <= end; j += 4)
#pragma unroll
      for (int u = 0; u < 4; ++u)
        s[u] += dy.ld(int64_t(pos[j + u]) * h + c);
    for (int u = 0; j < end; ++j, ++u)
      s[u] += dy.ld(int64_t(pos[j]) * h + c);
    dt[int64_t(key) * h + c] = (s[0] + s[1]) + (s[2] + s[3]);
  }
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

} // namespace

// Fully qualified: CUB's headers declare a ::cuda namespace too.
void mapp::rt::cuda::embedding(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  int64_t v = a.in[0].dim(0), h = a.in[0].dim(1), n = a.in[1].numel();
  if (!n || !h)
    return;
  auto [r, g] = cpu::groupPosition(a);
  embeddingKernel<<<gridFor(n, 1, be.smCount() * 32), 128, 0, be.stream()>>>(
      view(a.in[0]), a.in[1].i32(), view(a.out[0]), v, r * v, g * v, h, n,
      be.deviceError());
  MAPP_CUDA_LAUNCHED();
}

void mapp::rt::cuda::embedding_grad(const KernelArgs &a) {
  CudaBackend &be = backendOf(a);
  const Tensor &out = a.out[0];
  int64_t v = out.dim(0), h = out.dim(1), n = a.in[1].numel();
  if (be.config().deterministic && (n > INT_MAX || v >= INT_MAX))
    fail("embedding_grad: ", n, " ids into ", v,
         " rows exceed the CUDA backend's 32-bit sort keys");
  // Sums in fp32: into the output when it is fp32, else in scratch
  // converted afterwards. Rows no id names stay zero.
  float *acc = isBf16(out) ? static_cast<float *>(be.scratch(out.numel() * 4, 1))
                           : out.f32();
  MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, out.numel() * 4, be.stream()));
  if (n && h && !be.config().deterministic) {
    auto [r, g] = cpu::groupPosition(a);
    embeddingGradAtomic<<<gridFor(n, 1, be.smCount() * 32), 128, 0,
                          be.stream()>>>(view(a.in[0]), a.in[1].i32(), acc, v,
                                         r * v, g * v, h, n, be.deviceError());
    MAPP_CUDA_LAUNCHED();
  } else if (n && h) {
    auto [r, g] = cpu::groupPosition(a);
    int bits = 1; // keys lie in [0, v]
    while ((int64_t(1) << bits) <= v)
      ++bits;
    int items = static_cast<int>(n);
    size_t tempBytes = 0;
    MAPP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, tempBytes, static_cast<const int32_t *>(nullptr),
        static_cast<int32_t *>(nullptr), static_cast<const int32_t *>(nullptr),
        static_cast<int32_t *>(nullptr), items, 0, bits, be.stream()));
    // Slot 13: keys and positions, before and after the sort, then CUB's
    // temporary storage.
    size_t arr = align256(n * sizeof(int32_t));
    char *buf = static_cast<char *>(be.scratch(4 * arr + tempBytes, 13));
    int32_t *keys = reinterpret_cast<int32_t *>(buf),
            *keysSorted = reinterpret_cast<int32_t *>(buf + arr),
            *pos = reinterpret_cast<int32_t *>(buf + 2 * arr),
            *posSorted = reinterpret_cast<int32_t *>(buf + 3 * arr);
    embeddingGradKeys<<<gridFor(n, 256), 256, 0, be.stream()>>>(
        a.in[1].i32(), keys, pos, v, r * v, g * v, n, be.deviceError());
    MAPP_CUDA_LAUNCHED();
    MAPP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        buf + 4 * arr, tempBytes, keys, keysSorted, pos, posSorted, items, 0,
        bits, be.stream()));
    dim3 grid(gridFor(n, 1, be.smCount() * 32 / 4), static_cast<unsigned>((h + 127) / 128));
    embeddingGradRuns<<<grid, 128, 0, be.stream()>>>(view(a.in[0]), keysSorted,
                                                      posSorted, acc, v, h, n);
    MAPP_CUDA_LAUNCHED();
  }
  if (isBf16(out))
    copyConvert({acc, 0}, view(out), out.numel(), be.stream());
}

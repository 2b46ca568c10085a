//===- OptimGroup.cu - multi-tensor adamw / sgd launches ------------------===//
//
// One launch updates every member of an optimizer group (Fusion.h). The
// members' operands live in the persistent pool, whose addresses the memory
// plan fixes, so their descriptors are uploaded once when the program is
// bound; the per-step scalars (lr schedule, bias corrections, clip source)
// travel as kernel arguments, computed from the group's shared attrs exactly
// as the per-parameter kernels compute them. Each block updates one span of
// one member (found by a binary search over the members' first blocks) with
// the element code of Optim.h, so the result is bit-identical to one launch
// per parameter. ZeRO-1 ranges become each descriptor's start and length.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "Optim.h"

#include <algorithm>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// One member's update range, with pointers already at its first element.
struct OptimChunk {
  float *p;
  const float *g;
  float *m; // adamw: first moment; sgd: momentum buffer
  float *v; // adamw: second moment; sgd: unused
  __nv_bfloat16 *shadow;
  int64_t n;
  int64_t firstBlock; // the launch's block that starts this chunk
};

constexpr int kThreads = 256;
constexpr int64_t kSpan = kThreads * 8; // elements per block

/// By value: the updates store through float pointers, so a reference into
/// the descriptor array would be re-read after every store.
__device__ __forceinline__ OptimChunk chunkOf(const OptimChunk *chunks,
                                              int count, int64_t block) {
  int lo = 0, hi = count - 1; // the last chunk with firstBlock <= block
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (chunks[mid].firstBlock <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  return chunks[lo];
}

__global__ void adamwGroupKernel(const OptimChunk *chunks, int count,
                                 AdamWStep h, ClipSource clip) {
  const OptimChunk c = chunkOf(chunks, count, blockIdx.x);
  float coef = clip.coef();
  int64_t begin = (blockIdx.x - c.firstBlock) * kSpan;
  int64_t end = min(begin + kSpan, c.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    adamwElement(c.p, c.g, c.m, c.v, c.shadow, i, h, coef);
}

__global__ void sgdGroupKernel(const OptimChunk *chunks, int count, SgdStep h,
                               ClipSource clip) {
  const OptimChunk c = chunkOf(chunks, count, blockIdx.x);
  float coef = clip.coef();
  int64_t begin = (blockIdx.x - c.firstBlock) * kSpan;
  int64_t end = min(begin + kSpan, c.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads)
    sgdElement(c.p, c.g, c.m, c.shadow, i, h, coef);
}

} // namespace

void *cuda::bindOptimGroups(CudaBackend &be, const Program &p, FusionTable &t) {
  if (t.optimGroups.empty())
    return nullptr;
  std::vector<OptimChunk> all;
  std::vector<size_t> firstChunk;
  auto addr = [&](int v) { return be.valueTensor(v, Tensor{}, 0).f32(); };
  for (OptimGroup &g : t.optimGroups) {
    firstChunk.push_back(all.size());
    bool adam = g.members[0]->kernel == MAPP_KERNEL_NAME(adamw);
    g.leadParam = addr(g.members[0]->inputs[0]);
    int64_t blocks = 0;
    for (const Instr *in : g.members) {
      int64_t lo, hi;
      updateRange(in->attrs, p.values[in->inputs[0]].type.numel(), lo, hi);
      if (lo == hi)
        continue;
      float *param = addr(in->inputs[0]);
      __nv_bfloat16 *shadow = be.shadowOf(param);
      OptimChunk c;
      c.p = param + lo;
      c.g = addr(in->inputs[1]) + lo;
      c.m = addr(in->inputs[2]) + lo;
      c.v = adam ? addr(in->inputs[3]) + lo : nullptr;
      c.shadow = shadow ? shadow + lo : nullptr;
      c.n = hi - lo;
      c.firstBlock = blocks;
      blocks += (c.n + kSpan - 1) / kSpan;
      all.push_back(c);
    }
    g.numChunks = static_cast<int>(all.size() - firstChunk.back());
    g.blocks = blocks;
    if (blocks > INT32_MAX)
      fail(g.members[0]->kernel, ": an optimizer group of ", blocks,
           " blocks exceeds one launch's grid");
  }
  void *dev = nullptr;
  MAPP_CUDA_CHECK(
      cudaMalloc(&dev, std::max<size_t>(all.size(), 1) * sizeof(OptimChunk)));
  MAPP_CUDA_CHECK(cudaMemcpy(dev, all.data(), all.size() * sizeof(OptimChunk),
                             cudaMemcpyHostToDevice));
  for (size_t k = 0; k < t.optimGroups.size(); ++k)
    t.optimGroups[k].chunks = static_cast<OptimChunk *>(dev) + firstChunk[k];
  return dev;
}

void cuda::runOptimGroup(const KernelArgs &a, const OptimGroup &g) {
  CudaBackend &be = backendOf(a);
  const Instr &lead = *g.members[0];
  // The descriptors hold the bound program's pool addresses; a caller with
  // other storage would update the wrong tensors.
  if (a.numIn < 1 || a.in[0].data != g.leadParam)
    fail(lead.kernel, ": the optimizer group was bound to other storage "
                      "than this call's parameter (rebind the program)");
  for (int i = 0; i < a.numIn; ++i)
    if (isBf16(a.in[i]))
      fail(lead.kernel, ": operand ", i, " must be stored fp32");
  if (!g.blocks)
    return;
  auto chunks = static_cast<const OptimChunk *>(g.chunks);
  if (lead.kernel == MAPP_KERNEL_NAME(adamw))
    adamwGroupKernel<<<static_cast<unsigned>(g.blocks), kThreads, 0,
                       be.stream()>>>(
        chunks, g.numChunks, adamwStep(a.attrs, a.ctx.step), clipOf(a, 4));
  else
    sgdGroupKernel<<<static_cast<unsigned>(g.blocks), kThreads, 0,
                     be.stream()>>>(chunks, g.numChunks,
                                    sgdStep(a.attrs, a.ctx.step), clipOf(a, 3));
  MAPP_CUDA_LAUNCHED();
}

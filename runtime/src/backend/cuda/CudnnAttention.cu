//===- CudnnAttention.cu - fused attention through cuDNN's graph API ------===//
//
// cuDNN 9's flash-attention engines (forward and backward) reached through
// the backend (graph) API, loaded with dlopen at run time: the runtime takes
// no link-time dependency on cuDNN, which on the GPU machines ships only
// inside PyTorch's wheels. The operation graphs are the ones cuDNN's frontend
// builds for SDPA (matmul, scale, causal mask from generated indices, softmax
// decomposed into reductions and pointwise ops, matmul), which the runtime-
// fusion engines recognise; one execution plan per shape is built on first
// use and cached. Whatever fails (no library, no engine for the shape) is
// recorded and answered with `false`, and the caller runs its own kernels.
//
// Layouts: q/o/dO/dQ are [B,T,H] with H = heads·D, i.e. the graph's
// [B,heads,T,D] tensors with strides {T·H, D, H, 1}; k/v/dK/dV are
// [B,T,Hk] with Hk = kvHeads·D. Grouped-query attention (kvHeads < heads)
// is the frontend's graph: the matmuls broadcast the kv heads over each
// group of query heads, and dK, dV are full-head products reduced (summed)
// onto the kv heads inside the graph -- nothing is repeated in memory. The
// statistics (natural-log log-sum-exp of the scaled scores) are
// [B,heads,T,1] packed, exactly the lse layout of the own kernels, so either
// forward can feed either backward.
//
//===----------------------------------------------------------------------===//
#include "Attention.h"
#include "CudnnGraph.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;
using cudnn::Graph;

namespace {

/// Tensor ids of the variant pack.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV,
  kDQAccum, kOne, kFirstVirtual = 100 // Graph numbers virtual tensors from here
};

/// Graph choices cuDNN versions have differed on; tried in order until one
/// gets an engine (the frontend's current choice first).
struct Variant {
  const char *name;
  cudnnDataType_t indexType; // gen_index output / math
  cudnnDataType_t probType;  // P fed to the second matmul, reshaped Pᵀ/dSᵀ
  bool dqAccum;              // backward: dQ through an fp32 accumulator
  // backward, grouped-query: the full-head dK, dV before the group sum in
  // bf16 (the frontend's choice) or fp32
  cudnnDataType_t fullHeadType = CUDNN_DATA_BFLOAT16;
};
const Variant kForwardVariants[] = {
    {"int32-index/bf16-P", CUDNN_DATA_INT32, CUDNN_DATA_BFLOAT16, false},
    {"int32-index/f32-P", CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, false},
    {"f32-index/f32-P", CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, false},
};
const Variant kBackwardVariants[] = {
    {"int32-index/bf16-P/dQ-accum", CUDNN_DATA_INT32, CUDNN_DATA_BFLOAT16, true},
    {"int32-index/bf16-P/direct-dQ", CUDNN_DATA_INT32, CUDNN_DATA_BFLOAT16, false},
    {"int32-index/f32-P/dQ-accum", CUDNN_DATA_INT32, CUDNN_DATA_FLOAT, true},
    {"f32-index/f32-P/dQ-accum", CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, true},
    {"int32-index/bf16-P/dQ-accum/f32-full-head", CUDNN_DATA_INT32, CUDNN_DATA_BFLOAT16,
     true, CUDNN_DATA_FLOAT},
};

struct CachedPlan {
  cudnn::Engine engine;
  bool dqAccum = false;
  bool ok = false;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int>;

struct State {
  std::mutex mu;
  bool tried = false;
  cudnn::Api api;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  std::string loadReport;
  std::map<Key, CachedPlan> plans;
  std::vector<std::string> log; // plan outcomes, for the benchmark
  // Process lifetime; destroyed before the CUDA runtime's own exit handler
  // (constructed after it), so the handle's device memory is given back.
  ~State() {
    if (handle)
      api.destroy(handle);
  }
};

State &state() {
  static State s;
  return s;
}

struct Geometry {
  int64_t B, T, H, heads, D, kvHeads;
  float scale;
  int causal;
  int64_t Hk() const { return kvHeads * D; }
  bool grouped() const { return kvHeads != heads; }
  Graph::Dims qkv() const { return {{B, heads, T, D}, {T * H, D, H, 1}}; }
  Graph::Dims kv() const { return {{B, kvHeads, T, D}, {T * Hk(), D, Hk(), 1}}; }
  Graph::Dims kvTransposed() const { return {{B, kvHeads, D, T}, {T * Hk(), D, 1, Hk()}}; }
  Graph::Dims scores() const { return {{B, heads, T, T}, {heads * T * T, T * T, T, 1}}; }
  Graph::Dims scoresT() const { return {{B, heads, T, T}, {heads * T * T, T * T, 1, T}}; }
  Graph::Dims rows() const { return {{B, heads, T, 1}, {heads * T, T, 1, 1}}; }
  Graph::Dims packed() const { return {{B, heads, T, D}, {heads * T * D, T * D, D, 1}}; }
};

/// scores·scale, then (causal) the upper triangle replaced by the lowest
/// float, as the frontend's causal_mask builds it.
cudnnBackendDescriptor_t scaleAndMask(Graph &g, const Variant &var,
                                      cudnnBackendDescriptor_t s, Graph::Dims d,
                                      bool causal) {
  auto scaled = g.virt(CUDNN_DATA_FLOAT, d);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, g.scalar(kScale));
  if (!causal)
    return scaled;
  auto row = g.virt(var.indexType, d), col = g.virt(var.indexType, d);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, row, nullptr, nullptr, var.indexType, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, col, nullptr, nullptr, var.indexType, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, d);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(CUDNN_DATA_FLOAT, d);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, masked, g.scalar(kMaskValue), keep);
  return masked;
}

/// O = softmax(mask(scale·QKᵀ))·V and its row statistics.
void buildForward(Graph &g, const Geometry &sh, const Variant &var) {
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, sh.kvTransposed(), false);
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, sh.kv(), false);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), false);
  auto sc = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.matmul(q, kt, sc);
  auto masked = scaleAndMask(g, var, sc, sh.scores(), sh.causal);
  auto mx = g.virt(CUDNN_DATA_FLOAT, sh.rows());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, mx);
  auto ex = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, ex);
  auto sum = g.virt(CUDNN_DATA_FLOAT, sh.rows());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  auto lg = g.virt(CUDNN_DATA_FLOAT, sh.rows());
  g.pointwise(CUDNN_POINTWISE_LOG, sum, lg);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, stats, lg);
  auto p = g.virt(var.probType, sh.scores());
  g.pointwise(CUDNN_POINTWISE_DIV, ex, p, sum);
  g.matmul(p, v, o);
}

/// dQ, dK, dV from dO, O and the forward's statistics (dQ through an fp32
/// accumulator that the caller zeroes, as the frontend does for cuDNN 9, or
/// directly).
void buildBackward(Graph &g, const Geometry &sh, const Variant &var) {
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, sh.kvTransposed(), false);
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, sh.kvTransposed(), false);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto dO = g.tensor(kDO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), false);
  auto dQ = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto dK = g.tensor(kDK, CUDNN_DATA_BFLOAT16, sh.kv(), false);
  auto dV = g.tensor(kDV, CUDNN_DATA_BFLOAT16, sh.kv(), false);
  // Grouped-query: dK, dV are computed per query head, then summed onto
  // the kv heads ("b (hk g) t d -> b hk t d").
  auto perQueryHead = [&](cudnnBackendDescriptor_t out) {
    return sh.grouped() ? g.virt(var.fullHeadType, sh.packed()) : out;
  };
  auto sumGroups = [&](cudnnBackendDescriptor_t full, cudnnBackendDescriptor_t out) {
    if (sh.grouped())
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  auto one = g.scalar(kOne);
  // softmax_sum = rowsum(dO∘O)
  auto prod = g.virt(CUDNN_DATA_FLOAT, sh.qkv());
  g.pointwise(CUDNN_POINTWISE_MUL, dO, prod, o);
  auto red = g.virt(CUDNN_DATA_FLOAT, sh.rows());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, red);
  auto softmaxSum = g.virt(CUDNN_DATA_FLOAT, sh.rows());
  g.pointwise(CUDNN_POINTWISE_MUL, red, softmaxSum, one);
  // P = exp(mask(scale·QKᵀ) − stats); dV = Pᵀ·dO
  auto sc = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.matmul(q, kt, sc);
  auto masked = scaleAndMask(g, var, sc, sh.scores(), sh.causal);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, stats);
  auto p = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, p);
  auto pt = g.virt(var.probType, sh.scoresT());
  g.reshape(p, pt);
  auto dVFull = perQueryHead(dV);
  g.matmul(pt, dO, dVFull);
  sumGroups(dVFull, dV);
  // dS = P∘(dO·Vᵀ − softmax_sum)·scale; dK = dSᵀ·Q; dQ = dS·K
  auto dP = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.matmul(dO, vt, dP);
  auto dP1 = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_MUL, dP, dP1, one);
  auto dP2 = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_SUB, dP1, dP2, softmaxSum);
  auto dP3 = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_MUL, dP2, dP3, p);
  auto dS = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_MUL, dP3, dS, g.scalar(kScale));
  auto dST = g.virt(var.probType, sh.scoresT());
  g.reshape(dS, dST);
  auto dKFull = perQueryHead(dK);
  g.matmul(dST, q, dKFull);
  sumGroups(dKFull, dK);
  auto k = g.virt(CUDNN_DATA_BFLOAT16, sh.kv());
  g.reshape(kt, k);
  if (var.dqAccum) {
    auto acc = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, sh.packed(), false, false, true);
    g.matmul(dS, k, acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, dQ);
  } else {
    g.matmul(dS, k, dQ);
  }
}

std::string describe(const Geometry &sh, bool fwd) {
  std::ostringstream os;
  os << (fwd ? "forward" : "backward") << " B=" << sh.B << " T=" << sh.T
     << " heads=" << sh.heads << " kv_heads=" << sh.kvHeads << " D=" << sh.D
     << (sh.causal ? " causal" : "");
  return os.str();
}

/// The cached plan for a shape, built on first use; null when cuDNN cannot
/// run it (the reason is logged once).
CachedPlan *planFor(State &s, const Geometry &sh, bool fwd, bool verbose) {
  Key key{fwd, sh.B, sh.T, sh.H, sh.heads, sh.kvHeads, sh.D, sh.scale, sh.causal};
  auto it = s.plans.find(key);
  if (it != s.plans.end())
    return it->second.ok ? &it->second : nullptr;
  CachedPlan plan;
  std::string failures;
  const Variant *vars = fwd ? kForwardVariants : kBackwardVariants;
  size_t count = fwd ? std::size(kForwardVariants) : std::size(kBackwardVariants);
  for (size_t i = 0; i < count && !plan.ok; ++i) {
    const Variant &var = vars[i];
    if (!sh.grouped() && var.fullHeadType != CUDNN_DATA_BFLOAT16)
      continue; // the choice exists only with grouped-query attention
    try {
      Graph g(s.api);
      if (fwd)
        buildForward(g, sh, var);
      else
        buildBackward(g, sh, var);
      plan.engine = g.finish(s.handle);
      plan.dqAccum = var.dqAccum;
      plan.ok = true;
      s.log.push_back(describe(sh, fwd) + " [" + var.name + "]: " + plan.engine.how +
                      ", workspace " + std::to_string(plan.engine.workspace) + " B");
    } catch (const cudnn::Failure &f) {
      failures += "\n    [" + std::string(var.name) + "] " + f.what;
    }
  }
  if (!plan.ok)
    s.log.push_back(describe(sh, fwd) + ": cuDNN unsupported, own kernels used:" + failures);
  if (verbose) // MAPP_CUDNN_VERBOSE
    std::fprintf(stderr, "mapp: %s\n", s.log.back().c_str());
  auto &slot = s.plans[key] = plan;
  return slot.ok ? &slot : nullptr;
}

/// Loaded, bound to the backend's stream; false when cuDNN is not usable.
bool ready(State &s, CudaBackend &be) {
  if (!s.tried) {
    s.tried = true;
    if (cudnn::loadLibrary(s.api, s.loadReport, be.config().cudnnLib)) {
      cudnnStatus_t st = s.api.create(&s.handle);
      if (st != CUDNN_STATUS_SUCCESS) {
        s.loadReport += ", but cudnnCreate failed: " + cudnn::statusText(s.api, st);
        s.handle = nullptr;
      }
    }
  }
  if (!s.handle)
    return false;
  if (s.stream != be.stream()) {
    if (s.api.setStream(s.handle, be.stream()) != CUDNN_STATUS_SUCCESS)
      return false;
    s.stream = be.stream();
  }
  return true;
}

void run(State &s, CudaBackend &be, CachedPlan &plan, std::vector<int64_t> uids,
         std::vector<void *> ptrs, const char *what) {
  const cudnn::Api &a = s.api;
  void *ws = plan.engine.workspace ? be.scratch(plan.engine.workspace, 5) : nullptr;
  cudnnBackendDescriptor_t pack = nullptr;
  cudnn::check(a, a.createDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "variant pack");
  struct Release {
    const cudnn::Api &a;
    cudnnBackendDescriptor_t d;
    ~Release() { a.destroyDesc(d); }
  } release{a, pack};
  cudnn::check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                     static_cast<int64_t>(uids.size()), uids.data()),
        "variant pack ids");
  cudnn::check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                     static_cast<int64_t>(ptrs.size()), ptrs.data()),
        "variant pack pointers");
  cudnn::check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
        "variant pack workspace");
  cudnn::check(a, a.finalize(pack), "variant pack");
  cudnn::check(a, a.execute(s.handle, plan.engine.plan, pack), std::string("execute ") + what);
}

bool aligned(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

/// cuDNN's SDPA takes head dims that are multiples of 8 up to 256 (16-byte
/// rows of bf16); whether an engine exists for one is cuDNN's answer.
bool headDimFits(int64_t D) { return D > 0 && D % 8 == 0 && D <= 256; }

} // namespace

bool cuda::cudnnAttnForward(CudaBackend &be, const AttnCall &c, const void *q,
                            const void *k, const void *v, void *o, float *stats) {
  AttnImpl impl = attnImpl(be);
  if (impl == AttnImpl::Own || impl == AttnImpl::Wmma)
    return false;
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool forced = impl == AttnImpl::Cudnn;
  if (!ready(s, be)) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.loadReport);
    return false;
  }
  if (!headDimFits(c.D) || !aligned(q) || !aligned(k) || !aligned(v) || !aligned(o))
    return false;
  Geometry sh{c.B, c.T, c.H, c.heads, c.D, c.kvHeads, c.scale, c.causal};
  CachedPlan *plan = planFor(s, sh, true, be.config().cudnnVerbose);
  if (!plan) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.log.back());
    return false;
  }
  float scale = c.scale, maskValue = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void *> ptrs{const_cast<void *>(q), const_cast<void *>(k),
                           const_cast<void *>(v), o, stats, &scale};
  if (c.causal) {
    uids.push_back(kMaskValue);
    ptrs.push_back(&maskValue);
  }
  try {
    run(s, be, *plan, uids, ptrs, "forward");
  } catch (const cudnn::Failure &f) {
    fail("cuDNN attention ", f.what);
  }
  return true;
}

bool cuda::cudnnAttnBackward(CudaBackend &be, const AttnCall &c, const void *q,
                             const void *k, const void *v, const void *o,
                             const void *dout, const float *stats, void *dq, void *dk,
                             void *dv) {
  AttnImpl impl = attnImpl(be);
  if (impl == AttnImpl::Own || impl == AttnImpl::Wmma)
    return false;
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  bool forced = impl == AttnImpl::Cudnn;
  if (!ready(s, be)) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.loadReport);
    return false;
  }
  for (const void *p : {q, k, v, o, dout, static_cast<const void *>(dq),
                        static_cast<const void *>(dk), static_cast<const void *>(dv)})
    if (!aligned(p))
      return false;
  if (!headDimFits(c.D))
    return false;
  Geometry sh{c.B, c.T, c.H, c.heads, c.D, c.kvHeads, c.scale, c.causal};
  CachedPlan *plan = planFor(s, sh, false, be.config().cudnnVerbose);
  if (!plan) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.log.back());
    return false;
  }
  float scale = c.scale, one = 1.0f, maskValue = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne};
  std::vector<void *> ptrs{const_cast<void *>(q), const_cast<void *>(k),
                           const_cast<void *>(v), const_cast<void *>(o),
                           const_cast<void *>(dout), const_cast<float *>(stats),
                           dq, dk, dv, &scale, &one};
  if (c.causal) {
    uids.push_back(kMaskValue);
    ptrs.push_back(&maskValue);
  }
  if (plan->dqAccum) {
    size_t accBytes = static_cast<size_t>(c.B * c.T * c.H) * 4;
    void *acc = be.scratch(accBytes, 4);
    MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, accBytes, be.stream()));
    uids.push_back(kDQAccum);
    ptrs.push_back(acc);
  }
  try {
    run(s, be, *plan, uids, ptrs, "backward");
  } catch (const cudnn::Failure &f) {
    fail("cuDNN attention ", f.what);
  }
  return true;
}

std::string cuda::cudnnAttnReport() {
  State &s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::string r = s.tried ? s.loadReport : "cuDNN not tried";
  for (const std::string &l : s.log)
    r += "\n  " + l;
  return r;
}

std::string cuda::cudnnAttnDryRun(bool &ok) {
  cudnn::Api api;
  std::string report;
  ok = cudnn::loadLibrary(api, report, CudaConfig::fromEnv().cudnnLib);
  if (!ok)
    return report;
  // Every descriptor and operation of each graph variant is built and
  // finalized; only the operation graph and the plans need a handle (a GPU).
  // Multi-head and grouped-query (4 query heads over 2 kv heads).
  for (Geometry sh : {Geometry{2, 256, 2 * 128, 2, 128, 2, 0.088f, 1},
                      Geometry{2, 256, 4 * 128, 4, 128, 2, 0.088f, 1}})
    for (bool fwd : {true, false}) {
      const Variant *vars = fwd ? kForwardVariants : kBackwardVariants;
      size_t count = fwd ? std::size(kForwardVariants) : std::size(kBackwardVariants);
      for (size_t i = 0; i < count; ++i) {
        report += "\n  " + describe(sh, fwd) + " [" + vars[i].name + "]: ";
        try {
          Graph g(api);
          if (fwd)
            buildForward(g, sh, vars[i]);
          else
            buildBackward(g, sh, vars[i]);
          report += std::to_string(g.numOps()) + " operations finalized";
        } catch (const cudnn::Failure &f) {
          report += "FAILED " + f.what;
          ok = false;
        }
      }
    }
  return report;
}

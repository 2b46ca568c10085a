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
// Layouts: q/k/v/o/dO and the gradients are [B,T,H] with H = heads·D, i.e.
// the graph's [B,heads,T,D] tensors with strides {T·H, D, H, 1}; the
// statistics (natural-log log-sum-exp of the scaled scores) are
// [B,heads,T,1] packed, exactly the lse layout of the own kernels, so either
// forward can feed either backward.
//
//===----------------------------------------------------------------------===//
#include "Attention.h"

#include <cudnn_graph.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// The few entry points used, resolved with dlsym.
struct Api {
  void *lib = nullptr;
  size_t (*getVersion)() = nullptr;
  const char *(*errorString)(cudnnStatus_t) = nullptr;
  void (*lastError)(char *, size_t) = nullptr; // optional (9.0+)
  cudnnStatus_t (*create)(cudnnHandle_t *) = nullptr;
  cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t) = nullptr;
  cudnnStatus_t (*createDesc)(cudnnBackendDescriptorType_t,
                              cudnnBackendDescriptor_t *) = nullptr;
  cudnnStatus_t (*destroyDesc)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t) = nullptr;
  cudnnStatus_t (*setAttr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                           cudnnBackendAttributeType_t, int64_t,
                           const void *) = nullptr;
  cudnnStatus_t (*getAttr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                           cudnnBackendAttributeType_t, int64_t, int64_t *,
                           void *) = nullptr;
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t,
                           cudnnBackendDescriptor_t) = nullptr;
};

/// A failed cuDNN call: which step, and cuDNN's own words.
struct CudnnFailure {
  std::string what;
};

// Deprecated in 9.x headers but still the way to bind a handle to an
// operation graph and a plan; spelled by value to keep the build warning-free.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

/// Tensor ids of the variant pack.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV,
  kDQAccum, kOne, kFirstVirtual = 100
};

/// Graph choices cuDNN versions have differed on; tried in order until one
/// gets an engine (the frontend's current choice first).
struct Variant {
  const char *name;
  cudnnDataType_t indexType; // gen_index output / math
  cudnnDataType_t probType;  // P fed to the second matmul, reshaped Pᵀ/dSᵀ
};
const Variant kVariants[] = {
    {"int32-index/bf16-P", CUDNN_DATA_INT32, CUDNN_DATA_BFLOAT16},
    {"int32-index/f32-P", CUDNN_DATA_INT32, CUDNN_DATA_FLOAT},
    {"f32-index/f32-P", CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT},
};

struct CachedPlan {
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  bool ok = false;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, float, int>;

struct State {
  std::mutex mu;
  bool tried = false;
  Api api;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  std::string loadReport;
  std::map<Key, CachedPlan> plans;
  std::vector<std::string> log; // plan outcomes, for the benchmark
};

State &state() {
  static State s;
  return s;
}

std::string statusText(const Api &api, cudnnStatus_t st) {
  std::string s = api.errorString ? api.errorString(st) : "status";
  s += " (" + std::to_string(static_cast<int>(st)) + ")";
  if (api.lastError) {
    char buf[512] = {0};
    api.lastError(buf, sizeof(buf));
    if (buf[0])
      s += ": " + std::string(buf);
  }
  return s;
}

void check(const Api &api, cudnnStatus_t st, const std::string &step) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw CudnnFailure{step + ": " + statusText(api, st)};
}

template <typename F> bool resolve(void *lib, F &fn, const char *name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

/// Loads libcudnn (MAPP_CUDNN_LIB first, then the default names). With an
/// explicit path its sibling sub-libraries are loaded first, by path, so the
/// shim's own by-name loads find them without LD_LIBRARY_PATH.
bool load(State &s) {
  std::vector<std::string> names;
  if (const char *e = std::getenv("MAPP_CUDNN_LIB"))
    names.push_back(e);
  names.push_back("libcudnn.so.9");
  names.push_back("libcudnn.so");
  std::string errors;
  for (const std::string &n : names) {
    size_t slash = n.rfind('/');
    if (slash != std::string::npos)
      for (const char *sub : {"libcudnn_graph.so.9", "libcudnn_heuristic.so.9",
                              "libcudnn_engines_precompiled.so.9",
                              "libcudnn_engines_runtime_compiled.so.9"})
        dlopen((n.substr(0, slash + 1) + sub).c_str(), RTLD_NOW | RTLD_GLOBAL);
    void *lib = dlopen(n.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char *why = dlerror();
      errors += "  " + n + ": " + (why ? why : "not found") + "\n";
      continue;
    }
    Api &a = s.api;
    a.lib = lib;
    bool ok = resolve(lib, a.getVersion, "cudnnGetVersion") &&
              resolve(lib, a.errorString, "cudnnGetErrorString") &&
              resolve(lib, a.create, "cudnnCreate") &&
              resolve(lib, a.setStream, "cudnnSetStream") &&
              resolve(lib, a.createDesc, "cudnnBackendCreateDescriptor") &&
              resolve(lib, a.destroyDesc, "cudnnBackendDestroyDescriptor") &&
              resolve(lib, a.finalize, "cudnnBackendFinalize") &&
              resolve(lib, a.setAttr, "cudnnBackendSetAttribute") &&
              resolve(lib, a.getAttr, "cudnnBackendGetAttribute") &&
              resolve(lib, a.execute, "cudnnBackendExecute");
    resolve(lib, a.lastError, "cudnnGetLastErrorString");
    if (!ok) {
      errors += "  " + n + ": missing backend API symbols\n";
      continue;
    }
    size_t v = a.getVersion();
    if (v < 90000) {
      errors += "  " + n + ": version " + std::to_string(v) + " < 9.0\n";
      continue;
    }
    cudnnStatus_t st = a.create(&s.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      errors += "  " + n + ": cudnnCreate: " + statusText(a, st) + "\n";
      continue;
    }
    std::ostringstream os;
    os << "cuDNN " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100
       << " loaded from " << n;
    s.loadReport = os.str();
    return true;
  }
  s.api = Api{};
  s.loadReport = "cuDNN not loaded:\n" + errors;
  return false;
}

/// Builds one operation graph; every descriptor is kept alive with the plan.
class Graph {
public:
  Graph(State &s, const Variant &var) : s_(s), a_(s.api), var_(var) {}

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t, const char *what) {
    cudnnBackendDescriptor_t d = nullptr;
    check(a_, a_.createDesc(t, &d), std::string("create ") + what);
    keep_.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
           cudnnBackendAttributeType_t t, int64_t count, const void *v,
           const char *what) {
    check(a_, a_.setAttr(d, n, t, count, v), std::string("set ") + what);
  }
  void fin(cudnnBackendDescriptor_t d, const std::string &what) {
    check(a_, a_.finalize(d), "finalize " + what);
  }

  struct Dims {
    int64_t d[4], s[4];
  };

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims g,
                                  bool isVirtual, bool byValue = false,
                                  bool reorderF16x16 = false) {
    if (uid < 0)
      uid = nextVirtual_++;
    auto d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    int64_t align = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, g.d, "tensor dims");
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, g.s, "tensor strides");
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    bool v = isVirtual, bv = byValue;
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v, "tensor virtual");
    if (byValue)
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv, "tensor by-value");
    if (reorderF16x16) {
      cudnnBackendTensorReordering_t r = CUDNN_TENSOR_REORDERING_F16x16;
      set(d, CUDNN_ATTR_TENSOR_REORDERING_MODE, CUDNN_TYPE_TENSOR_REORDERING_MODE, 1,
          &r, "tensor reordering");
    }
    fin(d, "tensor " + std::to_string(uid));
    return d;
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims g) {
    return tensor(-1, type, g, true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, Dims{{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true);
  }

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t b = nullptr,
                 cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    std::string what = "pointwise mode " + std::to_string(static_cast<int>(mode));
    auto pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pw mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pw precision");
    if (axis >= 0)
      set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pw axis");
    fin(pw, what);
    auto op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1, &pw, "pw op desc");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "pw x");
    if (b)
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &b, "pw b");
    if (t)
      set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &t, "pw t");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "pw y");
    fin(op, what + " op");
    ops_.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    auto rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red,
        "reduction operator");
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec,
        "reduction precision");
    fin(rd, "reduction");
    auto op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reduction x");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reduction y");
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd,
        "reduction desc");
    fin(op, "reduction op");
    ops_.push_back(op);
  }

  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t c) {
    auto md = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul precision");
    fin(md, "matmul");
    auto op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md,
        "matmul desc");
    fin(op, "matmul op");
    ops_.push_back(op);
  }

  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    auto op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
        "reshape x");
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
        "reshape y");
    fin(op, "reshape op");
    ops_.push_back(op);
  }

  /// scores·scale, then (causal) the upper triangle replaced by the lowest
  /// float, as the frontend's causal_mask builds it.
  cudnnBackendDescriptor_t scaleAndMask(cudnnBackendDescriptor_t s, Dims g, bool causal) {
    auto scaled = virt(CUDNN_DATA_FLOAT, g);
    pointwise(CUDNN_POINTWISE_MUL, s, scaled, scalar(kScale));
    if (!causal)
      return scaled;
    auto row = virt(var_.indexType, g), col = virt(var_.indexType, g);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, row, nullptr, nullptr, var_.indexType, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, col, nullptr, nullptr, var_.indexType, 3);
    auto keep = virt(CUDNN_DATA_BOOLEAN, g);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, CUDNN_DATA_BOOLEAN);
    auto masked = virt(CUDNN_DATA_FLOAT, g);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, masked, scalar(kMaskValue), keep);
    return masked;
  }

  /// Operation graph, heuristics, and the first engine configuration whose
  /// plan finalizes.
  CachedPlan finish(const std::string &label) {
    auto g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    set(g, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &s_.handle, "graph handle");
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "graph ops");
    fin(g, "operation graph (" + std::to_string(ops_.size()) + " ops)");
    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      auto h = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
      set(h, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g,
          "heuristics graph");
      set(h, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
      cudnnStatus_t st = a_.finalize(h);
      if (st != CUDNN_STATUS_SUCCESS) {
        tried += " heur" + std::to_string(int(mode)) + ": " + statusText(a_, st) + ";";
        continue;
      }
      int64_t count = 0;
      check(a_, a_.getAttr(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                           0, &count, nullptr),
            "heuristics count");
      std::vector<cudnnBackendDescriptor_t> cfgs;
      for (int64_t i = 0; i < count; ++i)
        cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
      int64_t got = 0;
      if (count)
        check(a_, a_.getAttr(h, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             count, &got, cfgs.data()),
              "heuristics results");
      tried += " heur" + std::to_string(int(mode)) + ": " + std::to_string(got) + " configs";
      for (int64_t i = 0; i < got; ++i) {
        auto p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
        set(p, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &s_.handle, "plan handle");
        set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
            &cfgs[i], "plan config");
        st = a_.finalize(p);
        if (st != CUDNN_STATUS_SUCCESS) {
          tried += " [" + std::to_string(i) + "] " + statusText(a_, st) + ";";
          continue;
        }
        CachedPlan plan;
        plan.plan = p;
        int64_t n = 0;
        check(a_, a_.getAttr(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                             &n, &plan.workspace),
              "plan workspace size");
        plan.ok = true;
        s_.log.push_back(label + " [" + var_.name + "]: engine config " + std::to_string(i) +
                         " of" + tried + ", workspace " + std::to_string(plan.workspace) +
                         " B");
        return plan;
      }
      tried += ";";
    }
    throw CudnnFailure{"no engine:" + tried};
  }

private:
  State &s_;
  const Api &a_;
  const Variant &var_;
  std::vector<cudnnBackendDescriptor_t> keep_, ops_;
  int64_t nextVirtual_ = kFirstVirtual;
};

struct Geometry {
  int64_t B, T, H, heads, D;
  float scale;
  int causal;
  Graph::Dims qkv() const { return {{B, heads, T, D}, {T * H, D, H, 1}}; }
  Graph::Dims transposed() const { return {{B, heads, D, T}, {T * H, D, 1, H}}; }
  Graph::Dims scores() const { return {{B, heads, T, T}, {heads * T * T, T * T, T, 1}}; }
  Graph::Dims scoresT() const { return {{B, heads, T, T}, {heads * T * T, T * T, 1, T}}; }
  Graph::Dims rows() const { return {{B, heads, T, 1}, {heads * T, T, 1, 1}}; }
  Graph::Dims packed() const { return {{B, heads, T, D}, {heads * T * D, T * D, D, 1}}; }
};

/// O = softmax(mask(scale·QKᵀ))·V and its row statistics.
CachedPlan buildForward(State &s, const Geometry &sh, const Variant &var) {
  Graph g(s, var);
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, sh.transposed(), false);
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), false);
  auto sc = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.matmul(q, kt, sc);
  auto masked = g.scaleAndMask(sc, sh.scores(), sh.causal);
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
  return g.finish("forward");
}

/// dQ, dK, dV from dO, O and the forward's statistics (dQ through an fp32
/// accumulator that the caller zeroes, as the frontend does on Hopper).
CachedPlan buildBackward(State &s, const Geometry &sh, const Variant &var) {
  Graph g(s, var);
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, sh.transposed(), false);
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, sh.transposed(), false);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto dO = g.tensor(kDO, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, sh.rows(), false);
  auto dQ = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto dK = g.tensor(kDK, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
  auto dV = g.tensor(kDV, CUDNN_DATA_BFLOAT16, sh.qkv(), false);
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
  auto masked = g.scaleAndMask(sc, sh.scores(), sh.causal);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, stats);
  auto p = g.virt(CUDNN_DATA_FLOAT, sh.scores());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, p);
  auto pt = g.virt(var.probType, sh.scoresT());
  g.reshape(p, pt);
  g.matmul(pt, dO, dV);
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
  g.matmul(dST, q, dK);
  auto k = g.virt(CUDNN_DATA_BFLOAT16, sh.qkv());
  g.reshape(kt, k);
  auto acc = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, sh.packed(), false, false, true);
  g.matmul(dS, k, acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, dQ);
  return g.finish("backward");
}

std::string describe(const Geometry &sh, bool fwd) {
  std::ostringstream os;
  os << (fwd ? "forward" : "backward") << " B=" << sh.B << " T=" << sh.T
     << " heads=" << sh.heads << " D=" << sh.D << (sh.causal ? " causal" : "");
  return os.str();
}

/// The cached plan for a shape, built on first use; null when cuDNN cannot
/// run it (the reason is logged once).
CachedPlan *planFor(State &s, const Geometry &sh, bool fwd) {
  Key key{fwd, sh.B, sh.T, sh.H, sh.heads, sh.D, sh.scale, sh.causal};
  auto it = s.plans.find(key);
  if (it != s.plans.end())
    return it->second.ok ? &it->second : nullptr;
  CachedPlan plan;
  std::string failures;
  for (const Variant &var : kVariants) {
    try {
      plan = fwd ? buildForward(s, sh, var) : buildBackward(s, sh, var);
      s.log.back() = describe(sh, fwd) + ": " + s.log.back();
      break;
    } catch (const CudnnFailure &f) {
      failures += "\n    [" + std::string(var.name) + "] " + f.what;
    }
  }
  if (!plan.ok)
    s.log.push_back(describe(sh, fwd) + ": cuDNN unsupported, own kernels used:" + failures);
  if (std::getenv("MAPP_CUDNN_VERBOSE"))
    std::fprintf(stderr, "mapp: %s\n", s.log.back().c_str());
  auto &slot = s.plans[key] = plan;
  return slot.ok ? &slot : nullptr;
}

/// Loaded, bound to the backend's stream; false when cuDNN is not usable.
bool ready(State &s, CudaBackend &be) {
  if (!s.tried) {
    s.tried = true;
    load(s);
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
  const Api &a = s.api;
  void *ws = plan.workspace ? be.scratch(plan.workspace, 5) : nullptr;
  cudnnBackendDescriptor_t pack = nullptr;
  check(a, a.createDesc(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack), "variant pack");
  struct Release {
    const Api &a;
    cudnnBackendDescriptor_t d;
    ~Release() { a.destroyDesc(d); }
  } release{a, pack};
  check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                     static_cast<int64_t>(uids.size()), uids.data()),
        "variant pack ids");
  check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                     static_cast<int64_t>(ptrs.size()), ptrs.data()),
        "variant pack pointers");
  check(a, a.setAttr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
        "variant pack workspace");
  check(a, a.finalize(pack), "variant pack");
  check(a, a.execute(s.handle, plan.plan, pack), std::string("execute ") + what);
}

bool aligned(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

} // namespace

AttnImpl cuda::attnImpl() {
  const char *e = std::getenv("MAPP_CUDA_ATTN");
  if (!e || !*e || std::strcmp(e, "auto") == 0)
    return AttnImpl::Auto;
  if (std::strcmp(e, "own") == 0)
    return AttnImpl::Own;
  if (std::strcmp(e, "cudnn") == 0)
    return AttnImpl::Cudnn;
  if (std::strcmp(e, "wmma") == 0)
    return AttnImpl::Wmma;
  fail("MAPP_CUDA_ATTN=", e, ": expected auto, own, cudnn or wmma");
}

bool cuda::cudnnAttnForward(CudaBackend &be, const AttnCall &c, const void *q,
                            const void *k, const void *v, void *o, float *stats) {
  AttnImpl impl = attnImpl();
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
  if ((c.D != 64 && c.D != 128) || !aligned(q) || !aligned(k) || !aligned(v) || !aligned(o))
    return false;
  Geometry sh{c.B, c.T, c.H, c.heads, c.D, c.scale, c.causal};
  CachedPlan *plan = planFor(s, sh, true);
  if (!plan) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.log.back());
    return false;
  }
  float scale = c.scale, maskValue = std::numeric_limits<float>::lowest();
  try {
    run(s, be, *plan, {kQ, kK, kV, kO, kStats, kScale, kMaskValue},
        {const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v), o, stats,
         &scale, &maskValue},
        "forward");
  } catch (const CudnnFailure &f) {
    fail("cuDNN attention ", f.what);
  }
  return true;
}

bool cuda::cudnnAttnBackward(CudaBackend &be, const AttnCall &c, const void *q,
                             const void *k, const void *v, const void *o,
                             const void *dout, const float *stats, void *dq, void *dk,
                             void *dv) {
  AttnImpl impl = attnImpl();
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
  if (c.D != 64 && c.D != 128)
    return false;
  Geometry sh{c.B, c.T, c.H, c.heads, c.D, c.scale, c.causal};
  CachedPlan *plan = planFor(s, sh, false);
  if (!plan) {
    if (forced)
      fail("MAPP_CUDA_ATTN=cudnn: ", s.log.back());
    return false;
  }
  size_t accBytes = static_cast<size_t>(c.B * c.T * c.H) * 4;
  void *acc = be.scratch(accBytes, 4);
  MAPP_CUDA_CHECK(cudaMemsetAsync(acc, 0, accBytes, be.stream()));
  float scale = c.scale, one = 1.0f, maskValue = std::numeric_limits<float>::lowest();
  try {
    run(s, be, *plan,
        {kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kDQAccum, kScale, kOne, kMaskValue},
        {const_cast<void *>(q), const_cast<void *>(k), const_cast<void *>(v),
         const_cast<void *>(o), const_cast<void *>(dout), const_cast<float *>(stats), dq,
         dk, dv, acc, &scale, &one, &maskValue},
        "backward");
  } catch (const CudnnFailure &f) {
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

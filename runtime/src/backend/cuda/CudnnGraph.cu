//===- CudnnGraph.cu - cuDNN graph API through dlopen ---------------------===//
//
// See CudnnGraph.h. Descriptor attributes follow cudnn_graph.h (cuDNN 9).
//
//===----------------------------------------------------------------------===//
#include "CudnnGraph.h"

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>

namespace mapp::rt::cuda::cudnn {

namespace {

template <typename F> bool resolve(void *lib, F &fn, const char *name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// Deprecated in 9.x headers but still the way to bind a handle to an
// operation graph and a plan; spelled by value to keep the build warning-free.
constexpr auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);
constexpr auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);

} // namespace

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
    throw Failure{step + ": " + statusText(api, st)};
}

/// Loads libcudnn (MAPP_CUDNN_LIB first, then the default names). With an
/// explicit path its sibling sub-libraries are loaded first, by path, so the
/// shim's own by-name loads find them without LD_LIBRARY_PATH.
bool loadLibrary(Api &api, std::string &report, const std::string &explicitLib) {
  std::vector<std::string> names;
  if (!explicitLib.empty())
    names.push_back(explicitLib);
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
    Api &a = api;
    a.lib = lib;
    bool ok = resolve(lib, a.getVersion, "cudnnGetVersion") &&
              resolve(lib, a.errorString, "cudnnGetErrorString") &&
              resolve(lib, a.create, "cudnnCreate") &&
              resolve(lib, a.destroy, "cudnnDestroy") &&
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
    std::ostringstream os;
    os << "cuDNN " << v / 10000 << "." << (v / 100) % 100 << "." << v % 100
       << " loaded from " << n;
    report = os.str();
    return true;
  }
  api = Api{};
  report = "cuDNN not loaded:\n" + errors;
  return false;
}

cudnnBackendDescriptor_t Graph::make(cudnnBackendDescriptorType_t t, const char *what) {
  cudnnBackendDescriptor_t d = nullptr;
  check(a_, a_.createDesc(t, &d), std::string("create ") + what);
  return d;
}
void Graph::set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
         cudnnBackendAttributeType_t t, int64_t count, const void *v,
         const char *what) {
  check(a_, a_.setAttr(d, n, t, count, v), std::string("set ") + what);
}
void Graph::fin(cudnnBackendDescriptor_t d, const std::string &what) {
  check(a_, a_.finalize(d), "finalize " + what);
}

cudnnBackendDescriptor_t Graph::tensor(int64_t uid, cudnnDataType_t type, Dims g,
                                     bool isVirtual, bool byValue, bool reorderF16x16) {
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
cudnnBackendDescriptor_t Graph::scalar(int64_t uid) {
  auto it = scalars_.find(uid);
  if (it != scalars_.end())
    return it->second;
  return scalars_[uid] =
             tensor(uid, CUDNN_DATA_FLOAT, Dims{{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true);
}

void Graph::pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                    cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t t, cudnnDataType_t prec, int64_t axis) {
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

void Graph::reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
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

void Graph::matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
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

void Graph::reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  auto op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape op");
  set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
      "reshape x");
  set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
      "reshape y");
  fin(op, "reshape op");
  ops_.push_back(op);
}

Engine Graph::finish(cudnnHandle_t handle) {
  auto g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  set(g, kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
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
      set(p, kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
      set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
          &cfgs[i], "plan config");
      st = a_.finalize(p);
      if (st != CUDNN_STATUS_SUCCESS) {
        tried += " [" + std::to_string(i) + "] " + statusText(a_, st) + ";";
        continue;
      }
      Engine e;
      e.plan = p;
      int64_t n = 0;
      check(a_, a_.getAttr(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                           &n, &e.workspace),
            "plan workspace size");
      e.how = "engine config " + std::to_string(i) + " of" + tried;
      return e;
    }
    tried += ";";
  }
  throw Failure{"no engine:" + tried};
}

} // namespace mapp::rt::cuda::cudnn

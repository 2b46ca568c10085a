//===- CudnnGraph.h - cuDNN graph API through dlopen (internal) -*- C++ -*-===//
//
// The cuDNN backend (graph) API as CudnnAttention.cu uses it: the entry
// points resolved from a library loaded at run time, and a builder that
// turns tensors and operations into an operation graph and an execution
// plan. Every failing call throws Failure naming the step and cuDNN's status
// and last-error text, so whoever runs it can tell what cuDNN refused.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_CUDNN_GRAPH_H
#define MAPP_RT_CUDA_CUDNN_GRAPH_H

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mapp::rt::cuda::cudnn {

/// The few entry points used, resolved with dlsym.
struct Api {
  void *lib = nullptr;
  size_t (*getVersion)() = nullptr;
  const char *(*errorString)(cudnnStatus_t) = nullptr;
  void (*lastError)(char *, size_t) = nullptr; // optional (9.0+)
  cudnnStatus_t (*create)(cudnnHandle_t *) = nullptr;
  cudnnStatus_t (*destroy)(cudnnHandle_t) = nullptr;
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
struct Failure {
  std::string what;
};

std::string statusText(const Api &api, cudnnStatus_t st);
/// Throws Failure unless st is success.
void check(const Api &api, cudnnStatus_t st, const std::string &step);

/// Loads libcudnn (MAPP_CUDNN_LIB first, then the default names) and
/// resolves the entry points; false with the reasons in `report` otherwise,
/// else `report` names the version and file. Creates no handle (needs no GPU).
bool loadLibrary(Api &api, std::string &report, const std::string &explicitLib);

/// A finalized execution plan and how it was found.
struct Engine {
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  std::string how; // heuristics mode, config index, earlier refusals
};

/// One operation graph under construction; descriptors live as long as the
/// process (plans are cached for its lifetime).
class Graph {
public:
  explicit Graph(const Api &api) : a_(api) {}

  struct Dims {
    int64_t d[4], s[4];
  };

  /// A 4-d tensor; uid < 0 picks a fresh virtual id.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims g,
                                  bool isVirtual, bool byValue = false,
                                  bool reorderF16x16 = false);
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims g) {
    return tensor(-1, type, g, true);
  }
  /// A by-value fp32 scalar; one descriptor per id, however often used.
  cudnnBackendDescriptor_t scalar(int64_t uid);

  /// y = mode(x[, b[, t]]) (binary_select: t is the condition).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t b = nullptr,
                 cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1);
  void reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y);
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t c);
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

  size_t numOps() const { return ops_.size(); }
  /// Operation graph, heuristics (mode A, then fallback), and the first
  /// engine configuration whose plan finalizes; Failure when none does.
  Engine finish(cudnnHandle_t handle);

private:
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t, const char *what);
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n,
           cudnnBackendAttributeType_t t, int64_t count, const void *v,
           const char *what);
  void fin(cudnnBackendDescriptor_t d, const std::string &what);

  const Api &a_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::map<int64_t, cudnnBackendDescriptor_t> scalars_;
  int64_t nextVirtual_ = 100;
};

} // namespace mapp::rt::cuda::cudnn

#endif

//===- CudaBackend.h - the CUDA backend's state (internal) ------*- C++ -*-===//
//
// One object per executor: the device, one compute stream, the cuBLASLt
// handle and workspace, a growable scratch buffer, the bf16 shadow copies of
// the parameters, caches that carry softmax statistics from forward kernels
// to their gradients, and the asynchronous error flag. Kernels reach it
// through KernelContext::backend.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_BACKEND_H
#define MAPP_RT_CUDA_BACKEND_H

#include "CudaCommon.h"
#include "CudaHandles.h"
#include "Fusion.h"
#include "TraceEvents.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/BackendConfig.h"
#include "mapp/rt/KernelVocab.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/ThreadPool.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace mapp::rt {
class Communicator;
}

namespace mapp::rt::cuda {

class DeviceComm;
class FusedKernels;

/// One function per kernel of KernelVocab.def whose cuda column is Y.
#define MAPP_CUDA_KERNEL(name) void name(const KernelArgs &a);
#include "CudaKernels.inc"
#undef MAPP_CUDA_KERNEL

class ProbeCapture;

/// Softmax statistics of one attention call, kept from the forward kernel
/// for its gradient: per (batch, head, row) log-sum-exp, and a copy of the
/// output (the gradient needs rowsum(dO∘O) but its operands exclude O).
struct AttnSaved {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  float *lse = nullptr;   // [B*heads*T]
  void *o = nullptr;      // [B,T,H] in the storage type of the forward's o
  int oBf16 = 0;
  int64_t numel = 0, rows = 0;
};

/// Row log-sum-exp of one cross_entropy call, reused by cross_entropy_grad.
struct CeSaved {
  const void *logits = nullptr;
  const void *targets = nullptr;
  float *lse = nullptr;
  int64_t rows = 0;
  int64_t count = -1; // non-ignored rows, or -1 when unknown
  int *countDev = nullptr;
};

class CudaBackend final : public Backend {
public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  KernelFn lookup(const std::string &kernel) const override;
  void *allocate(size_t bytes) override;
  void release(void *p) override;
  ThreadPool &pool() override { return pool_; }

  void copyToStorage(void *dst, const void *src, size_t bytes) override;
  void copyFromStorage(void *dst, const void *src, size_t bytes) override;
  void readScalarAsync(float *dst, const void *src) override;
  void zeroStorage(void *dst, size_t bytes) override;
  double sumSquares(const std::vector<Tensor> &ts) override;
  /// One tensor of a sumSquares call, as its kernel reads it.
  struct SquareSpan {
    const float *data;
    int64_t n;
    bool operator==(const SquareSpan &o) const { return data == o.data && n == o.n; }
  };
  void synchronize() override;
  void waitComm() override;
  double peakDeviceGiB() const override {
    return peakUsed_ > baselineUsed_ ? (peakUsed_ - baselineUsed_) / double(1 << 30) : 0;
  }
  uint64_t allocatedBytes() const override { return allocated_; }
  uint64_t peakAllocatedBytes() const override { return peakAllocated_; }
  uint64_t freeDeviceBytes() const override {
    size_t freeB = 0, total = 0;
    cudaSetDevice(device_);
    if (cudaMemGetInfo(&freeB, &total) != cudaSuccess)
      return 0;
    return freeB;
  }
  std::string deviceName() const override {
    cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, device_) == cudaSuccess ? prop.name : "";
  }
  uint64_t totalDeviceBytes() const override {
    size_t freeB = 0, total = 0;
    cudaSetDevice(device_);
    return cudaMemGetInfo(&freeB, &total) == cudaSuccess ? total : 0;
  }
  void bindProgram(const Program &p, void *pool, void *arena) override;
  Tensor operandView(const Program &p, const Instr &in, int value,
                     bool isOutput, const Tensor &t) override;
  size_t postedRecvBytes(Communicator &host, const Value &v) override;
  bool takePostedRecv(Communicator &host, const void *msg, const Tensor &out,
                      int peer, int64_t tag) override;
  void beginStep(int64_t step) override;
  void endStep() override;
  // Step graphs (StepCapture.cu; docs/cuda-graphs.md).
  bool stepGraphsAsked() const override { return config_.stepGraph; }
  std::string stepGraphsOff() const override;
  void *graphInput(int index, size_t bytes) override;
  void beginGraphCapture() override;
  void endGraphCapture(uint64_t id) override;
  bool launchGraph(uint64_t id, const std::vector<float *> &scalarDsts) override;
  void dropGraph(uint64_t id) override;
  /// Drops every graph: a buffer they point at is about to move.
  void dropGraphs();
  /// Whether [p, p + bytes) lies in one pinned graph input.
  bool isGraphInput(const void *p, size_t bytes) const;
  /// Fails naming `what` while a step is being captured (the capture is
  /// ended first): a synchronize or an allocation cannot be part of a graph
  /// (the warm-up step should have made every lazily created buffer).
  void notWhileCapturing(const char *what);
  // MegaScan marks: events on the compute stream (TraceEvents.h).
  bool traceMarksDeferred() const override { return true; }
  uint64_t traceMark() override {
    return traceEvents_.record(stream_, capturing_);
  }
  int traceMarkBank() const override {
    return traceEvents_.armed() ? traceEvents_.bank() : -1;
  }
  void reserveTraceMarks(size_t n) override { traceEvents_.reserve(n); }
  void resolveTraceMarks(uint64_t *marks, size_t n) override;
  const TraceEventPool &traceEvents() const { return traceEvents_; }
  void drainProbes() override;
  /// Queues the host copy of the probe slots captured since the last one
  /// (ProbeCapture::flush); at the step's end and before a synchronize.
  void flushProbes();
  void readFloats(const Program &p, int value, const void *src, int64_t offset,
                  int64_t n, float *dst) override;
  void writeFloats(const Program &p, int value, void *dst, int64_t offset,
                   int64_t n, const float *src) override;

  // --- for kernels
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t lt() const { return lt_; }
  void *ltWorkspace() const { return ltWorkspace_; }
  size_t ltWorkspaceBytes() const { return ltWorkspaceBytes_; }
  int smCount() const { return sms_; }
  DeviceError *deviceError() const { return devError_; }
  /// Device scratch of at least `bytes` in buffer `which` (0..13), valid until
  /// the next scratch() call on that buffer (work on the one stream is
  /// ordered, so reuse is safe). Conventions: 0 GEMM A / norm partials,
  /// 1 small per-kernel data, 2 reduce_sum / recomputed attention,
  /// 3 GEMM B / rotated k, 4 dQ accumulator, 5 free.
  void *scratch(size_t bytes, int which = 0);
  /// The bf16 shadow of a Param's fp32 master (null when it has none).
  __nv_bfloat16 *shadowOf(const void *master) const;
  AttnSaved &attnSaved(const void *q, int64_t rows, int64_t numel, int oBf16);
  AttnSaved *findAttn(const void *q, const void *k, const void *v);
  CeSaved &ceSaved(const void *logits, int64_t rows);
  CeSaved *findCe(const void *logits, const void *targets);
  /// Storage policy: "bf16" (default) or "f32" (every value as the plan says,
  /// for debugging numerics); MAPP_CUDA_STORAGE selects it.
  bool bf16Storage() const { return bf16Storage_; }
  /// The MAPP_* switches, read when the backend was created.
  const CudaConfig &config() const { return config_; }
  bool storesBf16() const override { return bf16Storage_; }
  /// Fused instruction pairs of the bound program (Fusion.h).
  const FusionTable &fusions() const { return fusions_; }
  /// The storage view of `value` in the arena slot of `anchor`, a tensor of
  /// the arena value `anchorValue` in the current call (pool values have one
  /// copy). For a fused call to reach its partner instruction's operands.
  Tensor valueTensor(int value, const Tensor &anchor, int anchorValue) const;
  /// MegaScope's capture ring and probe scratch (ProbeCapture.h), created
  /// by the first probe or perturb call.
  ProbeCapture &probeCapture();
  /// The device collectives for `host` (created on first use; Comm.cu), or
  /// null when payloads must be staged through host memory: a host
  /// communicator of other processes (mpi), a world of one, or
  /// MAPP_CUDA_COMM=host.
  DeviceComm *deviceComm(Communicator &host);
  int device() const { return device_; }
  /// How `value` reaches `in`'s kernel: operandView's storage type.
  DType storedDType(const Program &p, const Instr &in, int value, bool isOutput);
  /// The generated kernels of the bound program's `fused` instructions.
  FusedKernels &fusedKernels();

  /// MAPP_CUDA_PROFILE=1: device time per kernel name (CUDA events around
  /// every call from step 1 on), printed to stderr when the backend ends.
  /// Records nest: a kernel may open a detail record inside its own (a
  /// GEMM's shape and epilogue, named by profLabel with a leading space),
  /// which the report lists but leaves out of the total.
  void profBegin(const char *name);
  void profEnd();
  /// Whether this call is being timed (MAPP_CUDA_PROFILE=1, step ≥ 1).
  bool profiling() const { return profile_ && step_ >= 1; }
  /// A stable copy of a detail record's name.
  const char *profLabel(const std::string &label) {
    return profLabels_.insert(label).first->c_str();
  }

private:
  void refreshShadows();
  void *deviceAlloc(size_t bytes);

  int device_ = 0;
  int sms_ = 0;
  // Owned resources (CudaHandles.h): the stream is declared first so it is
  // destroyed last, after everything queued on it.
  Stream stream_;
  LtHandle lt_;
  DeviceBuffer<void> ltWorkspace_;
  size_t ltWorkspaceBytes_ = 0;
  ThreadPool pool_{1};
  const std::map<std::string, KernelFn> *table_ = nullptr; // cudaKernelTable()

  DeviceBuffer<DeviceError> devError_;
  PinnedBuffer<DeviceError> hostError_;
  DeviceBuffer<double> normDev_;
  std::vector<SquareSpan> normSpans_; // the last sumSquares list ...
  DeviceBuffer<SquareSpan> normSpansDev_; // ... and its copy on the device
  DeviceBuffer<double> normParts_;        // ... and its per-block partials
  PinnedBuffer<float> scalarPinned_; // readScalarAsync staging
  std::vector<float *> scalarDst_;
  size_t scalarCap_ = 0;
  PinnedBuffer<void> stage_[2]; // H2D staging, double-buffered
  size_t stageCap_[2] = {0, 0};
  Event stageDone_[2];
  int stageNext_ = 0;

  struct Scratch {
    void *p = nullptr;
    size_t bytes = 0;
  };
  Scratch scratch_[14]; // 6..9: grouped-query attention's repeated k/v, dk/dv;
                        // 10, 11: rotary attention's bf16 dq, dk from cuDNN;
                        // 12: rotary cos/sin table; 13: embedding_grad's sort

  CudaConfig config_;
  bool bf16Storage_ = true;
  // Per bound program: which values are stored bf16, and the shadows.
  const Program *prog_ = nullptr;
  uint8_t *poolBase_ = nullptr;
  std::vector<char> valueBf16_;
  struct Shadow {
    const float *master;
    __nv_bfloat16 *copy;
    int64_t numel;
  };
  std::vector<Shadow> shadows_;
  std::unordered_map<const void *, size_t> shadowIndex_;
  DeviceBuffer<__nv_bfloat16> shadowPool_;
  bool shadowsDirty_ = true;
  /// The plan's blocks from allocate() (persistent pool, arenas) and their
  /// sizes: --report-memory's "allocated" on a CUDA rank (scratch and
  /// library workspaces are outside the plan and not counted).
  std::vector<std::pair<void *, size_t>> allocations_;
  uint64_t allocated_ = 0, peakAllocated_ = 0;
  FusionTable fusions_;
  DeviceBuffer<void> optimChunks_; // the optimizer groups' descriptors

  struct ProfRec {
    const char *name;
    cudaEvent_t a, b;
  };
  bool profile_ = false;
  // Device memory in use (cudaMemGetInfo: the whole device) when the
  // context was new, and the most seen at any synchronize since.
  size_t baselineUsed_ = 0, peakUsed_ = 0;
  std::vector<Event> profEvents_;
  size_t profNext_ = 0;
  std::vector<ProfRec> profOpen_;
  std::vector<size_t> profStack_; // indices into profOpen_ of open records
  std::set<std::string> profLabels_;
  std::map<std::string, std::pair<double, int64_t>> profTotals_;
  int64_t profSteps_ = 0;
  void profCollect();
  void profReport();

  bool capturing_ = false;
  /// A captured step and the trace marks its nodes record (a range of the
  /// bank it was captured in; none when the step was not traced).
  struct StepGraphExec {
    GraphExec exec;
    int markBank = 0;
    size_t firstMark = 0, marks = 0;
  };
  std::map<uint64_t, StepGraphExec> graphs_;
  size_t captureFirstMark_ = 0; // the bank's marks taken when capture began
  std::vector<PinnedBuffer<void>> graphInputs_;
  std::vector<size_t> graphInputBytes_;

  TraceEventPool traceEvents_;
  std::unique_ptr<DeviceComm> deviceComm_;
  std::unique_ptr<FusedKernels> fusedKernels_;
  bool deviceCommChecked_ = false;

  std::unordered_map<const void *, AttnSaved> attn_;
  std::unordered_map<const void *, CeSaved> ce_;
  int64_t step_ = 0;
  std::unique_ptr<ProbeCapture> capture_;
};

inline CudaBackend &backendOf(const KernelArgs &a) {
  return *static_cast<CudaBackend *>(a.ctx.backend);
}

/// fp32 -> bf16 conversion of n elements (used for shadows and GEMM inputs).
void convertToBf16(const float *src, __nv_bfloat16 *dst, int64_t n,
                   cudaStream_t s);
/// *out = Σ parts[0..n) in a fixed order (one block): the last step of the
/// deterministic squared-sum reductions (gradient norms).
void sumPartials(const double *parts, int64_t n, double *out, cudaStream_t s);
/// Copies n elements between storage views of possibly different types.
void copyConvert(DView src, DView dst, int64_t n, cudaStream_t s);
void fillZero(DView dst, int64_t n, cudaStream_t s);
/// Row-major c[M,N] = a[M,K]·b[N,K]ᵀ, fp32 operands computed in fp32 (an
/// SGEMM, no TF32): for results held to a double reference (Gemm.cu).
void gemmF32(CudaBackend &be, const float *a, const float *b, float *c,
             int64_t M, int64_t N, int64_t K);

} // namespace mapp::rt::cuda

#endif

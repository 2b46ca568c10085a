//===- CudaBackend.cu - device memory, streams, storage policy ------------===//
#include "CudaBackend.h"
#include "LtSetup.cuh"
#include "ProbeCapture.h"
#include "DeviceComm.h"
#include "FusedKernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

constexpr size_t kScalarCap = 1 << 14;
/// Copies above this size skip the pinned staging buffers (parameter loads).
constexpr size_t kStageMax = size_t(64) << 20;

/// Σ x² over every span, one launch: blocks along y take one span each,
/// along x they stride through it; each block adds its sum to *out
/// (atomics, the default) or writes it to parts[y·gridDim.x + x]
/// (MAPP_CUDA_DETERMINISTIC=1: the order of the sums is fixed).
__global__ void sumSquaresKernel(const CudaBackend::SquareSpan *spans,
                                 double *parts, double *out) {
  const float *x = spans[blockIdx.y].data;
  int64_t n = spans[blockIdx.y].n;
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double v = x[i];
    s += v * v;
  }
  s = blockReduce(s, Sum());
  if (threadIdx.x == 0) {
    if (parts)
      parts[blockIdx.y * gridDim.x + blockIdx.x] = s;
    else
      atomicAdd(out, s);
  }
}

/// One block: each thread sums a strided share in index order, then the
/// block's fixed tree.
__global__ void sumPartialsKernel(const double *parts, int64_t n, double *out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s += parts[i];
  s = blockReduce(s, Sum());
  if (threadIdx.x == 0)
    *out = s;
}

const char *errorKernel(int code) {
  switch (code) {
  case kErrEmbeddingId: return "embedding";
  case kErrEmbeddingGradId: return "embedding_grad";
  case kErrCeTarget: return "cross_entropy";
  case kErrCeGradTarget: return "cross_entropy_grad";
  default: return "kernel";
  }
}

/// The vocabulary's property p of kernel k (KernelVocab.def), instead of
/// comparing names: a new optimizer or gradient sink needs no change here.
bool kernelHas(const std::string &k, KernelProp p) {
  const KernelInfo *info = findKernelInfo(k);
  return info && info->has(p);
}
bool isOptimizer(const std::string &k) { return kernelHas(k, kOptimizer); }

// Entry points: every kernel first asks whether it is half of a fused pair
// (Fusion.h); the kernels themselves stay unaware of fusion.
#define MAPP_CUDA_KERNEL(name)                                                 \
  void name##_entry(const KernelArgs &a) {                                     \
    if (!runFused(a))                                                          \
      cuda::name(a);                                                           \
  }
#include "CudaKernels.inc"
#undef MAPP_CUDA_KERNEL

// Profiling wrappers: one per kernel, timed by CUDA events.
const char *profName(const char *name, const KernelArgs &a) {
  if (std::strcmp(name, "matmul") == 0 && a.attrs.flag("transpose_a"))
    return "matmul(transpose_a)";
  return name;
}
#define MAPP_CUDA_KERNEL(name)                                                 \
  void name##_timed(const KernelArgs &a) {                                     \
    backendOf(a).profBegin(profName(#name, a));                                \
    name##_entry(a);                                                           \
    backendOf(a).profEnd();                                                    \
  }
#include "CudaKernels.inc"
#undef MAPP_CUDA_KERNEL

using KernelTable = std::map<std::string, KernelFn>;
/// Name -> entry point (timed: wrapped in profiling events) for every
/// KernelVocab.def row with cuda = Y; built without touching a device.
const KernelTable &cudaKernelTable(bool timed) {
  static const KernelTable entries = {
#define MAPP_CUDA_KERNEL(name) {#name, name##_entry},
#include "CudaKernels.inc"
#undef MAPP_CUDA_KERNEL
  };
  static const KernelTable timedEntries = {
#define MAPP_CUDA_KERNEL(name) {#name, name##_timed},
#include "CudaKernels.inc"
#undef MAPP_CUDA_KERNEL
  };
  return timed ? timedEntries : entries;
}

} // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    fail("--backend=cuda: no usable CUDA device (",
         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", ")");
  if (device < 0 || device >= count)
    fail("--backend=cuda: device ", device, " does not exist (", count,
         " visible)");
  MAPP_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp prop;
  MAPP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8)
    fail("--backend=cuda needs compute capability 8.0 or newer (bf16 tensor "
         "cores); device ", device, " is ", prop.major, ".", prop.minor);
  sms_ = prop.multiProcessorCount;
  config_ = CudaConfig::fromEnv(); // every MAPP_* switch, checked here
  bf16Storage_ = config_.bf16Storage;
  MAPP_CUDA_CHECK(cudaFree(nullptr)); // the context exists from here on
  size_t freeB = 0, totalB = 0;
  MAPP_CUDA_CHECK(cudaMemGetInfo(&freeB, &totalB));
  baselineUsed_ = totalB - freeB;
  MAPP_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
  MAPP_LT_CHECK(cublasLtCreate(lt_.out()));
  ltWorkspaceBytes_ = size_t(64) << 20;
  MAPP_CUDA_CHECK(cudaMalloc(ltWorkspace_.out(), ltWorkspaceBytes_));
  MAPP_CUDA_CHECK(cudaMalloc(devError_.out(), sizeof(DeviceError)));
  MAPP_CUDA_CHECK(cudaMemset(devError_, 0, sizeof(DeviceError)));
  MAPP_CUDA_CHECK(cudaMallocHost(hostError_.out(), sizeof(DeviceError)));
  MAPP_CUDA_CHECK(cudaMalloc(normDev_.out(), sizeof(double)));
  MAPP_CUDA_CHECK(cudaMallocHost(scalarPinned_.out(), kScalarCap * sizeof(float)));
  for (int i = 0; i < 2; ++i)
    MAPP_CUDA_CHECK(cudaEventCreateWithFlags(stageDone_[i].out(), cudaEventDisableTiming));
  profile_ = config_.profile;
  table_ = &cudaKernelTable(profile_);
}

CudaBackend::~CudaBackend() {
  // Errors are ignored here: a destructor must not throw, and the process is
  // usually exiting. The owned members (CudaHandles.h) go after this body,
  // the stream last.
  if (capturing_) { // a step failed inside its capture: end it
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial)
      cudaGraphDestroy(partial);
  }
  capture_.reset(); // its worker and side stream go before the stream
  cudaStreamSynchronize(stream_);
  deviceComm_.reset(); // its events and streams before the device state
  if (profile_) {
    profCollect();
    profReport();
  }
  for (auto &kv : attn_) {
    cudaFree(kv.second.lse);
    cudaFree(kv.second.o);
  }
  for (auto &kv : ce_) {
    cudaFree(kv.second.lse);
    cudaFree(kv.second.countDev);
  }
  for (Scratch &s : scratch_)
    cudaFree(s.p);
  for (auto &block : allocations_)
    cudaFree(block.first);
}

KernelFn CudaBackend::lookup(const std::string &kernel) const {
  auto it = table_->find(kernel);
  return it == table_->end() ? nullptr : it->second;
}

void *CudaBackend::deviceAlloc(size_t bytes) {
  notWhileCapturing("a device allocation");
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
  if (e != cudaSuccess) {
    size_t freeB = 0, totalB = 0;
    cudaMemGetInfo(&freeB, &totalB);
    fail("out of device memory allocating ", bytes, " bytes (", freeB >> 20,
         " MiB free of ", totalB >> 20, " MiB): ", cudaGetErrorString(e));
  }
  return p;
}

void *CudaBackend::allocate(size_t bytes) {
  // The executor asks twice: the persistent pool and all slots' arenas (one
  // block of slots × arena_bytes), each one cudaMalloc at the plan's layout.
  void *p = deviceAlloc(bytes);
  MAPP_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 256), stream_));
  MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  allocations_.push_back({p, bytes});
  allocated_ += bytes;
  peakAllocated_ = std::max(peakAllocated_, allocated_);
  return p;
}

void CudaBackend::release(void *p) {
  if (!p)
    return;
  auto it = std::find_if(allocations_.begin(), allocations_.end(),
                         [p](const auto &a) { return a.first == p; });
  if (it != allocations_.end()) {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
    allocated_ -= it->second;
    allocations_.erase(it);
  }
}

void *CudaBackend::scratch(size_t bytes, int which) {
  Scratch &s = scratch_[which];
  if (s.bytes < bytes) {
    // Grows only in the first steps; cudaFree waits for queued work.
    notWhileCapturing("a scratch buffer growing");
    dropGraphs(); // they hold the old address
    MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MAPP_CUDA_CHECK(cudaFree(s.p));
    s.bytes = std::max(bytes, s.bytes * 2);
    s.p = deviceAlloc(s.bytes);
  }
  return s.p;
}

void CudaBackend::copyToStorage(void *dst, const void *src, size_t bytes) {
  if (!bytes)
    return;
  if (poolBase_ && prog_ && static_cast<uint8_t *>(dst) >= poolBase_ &&
      static_cast<uint8_t *>(dst) < poolBase_ + prog_->persistentBytes)
    shadowsDirty_ = true;
  if (capturing_) {
    // The graph's copy reads `src` at every replay: the executor passes a
    // fixed pinned graph input (graphInput) and refills it before a launch.
    if (!isGraphInput(src, bytes))
      notWhileCapturing("a copy from host memory that is not a graph input");
    MAPP_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    return;
  }
  if (bytes > kStageMax) {
    MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MAPP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return;
  }
  // Pinned staging lets the copy run behind queued kernels without a sync.
  int i = stageNext_;
  stageNext_ ^= 1;
  MAPP_CUDA_CHECK(cudaEventSynchronize(stageDone_[i]));
  if (stageCap_[i] < bytes) {
    if (void *old = stage_[i].release())
      MAPP_CUDA_CHECK(cudaFreeHost(old));
    stageCap_[i] = std::max(bytes, size_t(1) << 20);
    MAPP_CUDA_CHECK(cudaMallocHost(stage_[i].out(), stageCap_[i]));
  }
  std::memcpy(stage_[i], src, bytes);
  MAPP_CUDA_CHECK(
      cudaMemcpyAsync(dst, stage_[i], bytes, cudaMemcpyHostToDevice, stream_));
  MAPP_CUDA_CHECK(cudaEventRecord(stageDone_[i], stream_));
}

void CudaBackend::copyFromStorage(void *dst, const void *src, size_t bytes) {
  if (!bytes)
    return;
  notWhileCapturing("a device-to-host copy");
  MAPP_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::readFloats(const Program &p, int value, const void *src,
                             int64_t offset, int64_t n, float *dst) {
  bool bf16 = prog_ == &p && valueBf16_.size() > static_cast<size_t>(value) &&
              valueBf16_[value];
  if (!bf16)
    return copyFromStorage(dst, static_cast<const float *>(src) + offset, n * 4);
  std::vector<uint16_t> h(n);
  copyFromStorage(h.data(), static_cast<const uint16_t *>(src) + offset, n * 2);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bf16ToFloat(h[i]);
}

void CudaBackend::writeFloats(const Program &p, int value, void *dst,
                              int64_t offset, int64_t n, const float *src) {
  bool bf16 = prog_ == &p && valueBf16_.size() > static_cast<size_t>(value) &&
              valueBf16_[value];
  if (!bf16)
    return copyToStorage(static_cast<float *>(dst) + offset, src, n * 4);
  std::vector<uint16_t> h(n);
  for (int64_t i = 0; i < n; ++i)
    h[i] = floatToBf16(src[i]);
  copyToStorage(static_cast<uint16_t *>(dst) + offset, h.data(), n * 2);
}

void CudaBackend::readScalarAsync(float *dst, const void *src) {
  if (scalarDst_.size() == kScalarCap)
    synchronize();
  size_t i = scalarDst_.size();
  scalarDst_.push_back(dst);
  MAPP_CUDA_CHECK(cudaMemcpyAsync(scalarPinned_ + i, src, sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::zeroStorage(void *dst, size_t bytes) {
  if (bytes)
    MAPP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

double CudaBackend::sumSquares(const std::vector<Tensor> &ts) {
  // One launch for every gradient (hundreds of tensors: a launch each was
  // host time in the middle of the step). The executor passes the same
  // list every step, so its descriptors go to the device once. Under
  // MAPP_CUDA_DETERMINISTIC=1 per-block partials and one fixed-order sum:
  // the norm is bit-identical run to run.
  std::vector<SquareSpan> spans;
  int64_t most = 0;
  for (const Tensor &t : ts)
    if (t.numel()) {
      spans.push_back({static_cast<const float *>(t.data), t.numel()});
      most = std::max(most, t.numel());
    }
  const bool det = config_.deterministic;
  if (spans.empty() || !det)
    MAPP_CUDA_CHECK(cudaMemsetAsync(normDev_, 0, sizeof(double), stream_));
  if (!spans.empty()) {
    unsigned gx = static_cast<unsigned>(std::min<int64_t>(gridFor(most, 256), 64));
    if (spans != normSpans_) {
      normSpans_ = spans;
      normSpansDev_.reset(static_cast<SquareSpan *>(
          deviceAlloc(spans.size() * sizeof(SquareSpan))));
      normParts_.reset(static_cast<double *>(
          deviceAlloc(spans.size() * gx * sizeof(double))));
      MAPP_CUDA_CHECK(cudaMemcpyAsync(normSpansDev_, normSpans_.data(),
                                      spans.size() * sizeof(SquareSpan),
                                      cudaMemcpyHostToDevice, stream_));
    }
    for (size_t first = 0; first < spans.size(); first += 65535) {
      unsigned count = static_cast<unsigned>(std::min<size_t>(spans.size() - first, 65535));
      sumSquaresKernel<<<dim3(gx, count), 256, 0, stream_>>>(
          normSpansDev_ + first, det ? normParts_ + first * gx : nullptr,
          normDev_);
      MAPP_CUDA_LAUNCHED();
    }
    if (det)
      sumPartials(normParts_, int64_t(spans.size()) * gx, normDev_, stream_);
  }
  double s = 0;
  copyFromStorage(&s, normDev_, sizeof(double));
  return s;
}

void cuda::sumPartials(const double *parts, int64_t n, double *out,
                       cudaStream_t s) {
  sumPartialsKernel<<<1, 1024, 0, s>>>(parts, n, out);
  MAPP_CUDA_LAUNCHED();
}

void CudaBackend::waitComm() {
  if (deviceComm_)
    deviceComm_->fence();
}

void CudaBackend::synchronize() {
  notWhileCapturing("a synchronize");
  waitComm(); // "queued work" includes the communicator's stream
  flushProbes(); // the run's copy overlaps the wait
  MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  size_t freeB = 0, totalB = 0;
  if (cudaMemGetInfo(&freeB, &totalB) == cudaSuccess)
    peakUsed_ = std::max(peakUsed_, totalB - freeB);
  traceEvents_.synchronized();
  if (profile_)
    profCollect();
  for (size_t i = 0; i < scalarDst_.size(); ++i)
    *scalarDst_[i] = scalarPinned_[i];
  scalarDst_.clear();
  MAPP_CUDA_CHECK(cudaMemcpy(hostError_, devError_, sizeof(DeviceError),
                             cudaMemcpyDeviceToHost));
  if (hostError_->code != kErrNone) {
    DeviceError e = *hostError_;
    MAPP_CUDA_CHECK(cudaMemset(devError_, 0, sizeof(DeviceError)));
    std::string moe = moeErrorText(e.code, e.a, e.b, e.c);
    if (!moe.empty())
      fail("step ", step_, ", ", moe);
    const char *what = e.code == kErrCeTarget || e.code == kErrCeGradTarget
                           ? "target"
                           : "id";
    fail("step ", step_, ", ", errorKernel(e.code), ": ", what, " ", e.a,
         " at position ", e.b, " is outside [0, ", e.c, ")",
         e.code == kErrCeTarget || e.code == kErrCeGradTarget
             ? " and is not ignore_index"
             : "");
  }
}

void CudaBackend::bindProgram(const Program &p, void *pool, void *) {
  prog_ = &p;
  poolBase_ = static_cast<uint8_t *>(pool);
  size_t nv = p.values.size();
  // Values consumed by a gradient sink (grad_accumulate) are parameter-
  // gradient contributions: they stay fp32 like the Grad buffers they feed.
  // A vector Param read by compute kernels only as a linear's bias gets a
  // bf16 shadow as well: the GEMM epilogue reads the bias in the output's
  // type, as autocast does (cuBLASLt has no algorithm for an fp32 bias with
  // a bf16 output).
  std::vector<char> feedsGrad(nv, 0), usedByCompute(nv, 0), biasOnly(nv, 1);
  for (const Block &b : p.blocks)
    for (const Instr &in : b.instrs) {
      bool sink = kernelHas(in.kernel, kGradSink);
      bool optimizer = isOptimizer(in.kernel);
      bool linear = in.kernel == MAPP_KERNEL_NAME(linear);
      for (size_t k = 0; k < in.inputs.size(); ++k) {
        int v = in.inputs[k];
        if (sink)
          feedsGrad[v] = 1;
        if (!optimizer)
          usedByCompute[v] = 1;
        if (!optimizer && !(linear && k == 2))
          biasOnly[v] = 0;
      }
    }
  valueBf16_.assign(nv, 0);
  // A plan planned for bf16 activations says how each value is stored, and
  // its slots are sized for that (the executor widened it when
  // bf16Storage_ is off); otherwise the rule below picks the same values
  // inside fp32-sized slots.
  const bool planned = hasBf16Storage(p);
  size_t shadowElems = 0;
  std::vector<int> shadowVals;
  for (size_t v = 0; v < nv; ++v) {
    const Value &val = p.values[v];
    bool f32 = val.type.dtype == DType::F32;
    if (planned)
      valueBf16_[v] = val.storedBf16;
    else if (bf16Storage_ && f32 && inArena(val.kind) &&
             val.kind != ValueKind::Loss && val.type.rank() >= 2 &&
             !feedsGrad[v])
      valueBf16_[v] = 1;
    if (bf16Storage_ && f32 && val.kind == ValueKind::Param &&
        (val.type.rank() >= 2 || biasOnly[v]) && usedByCompute[v]) {
      shadowVals.push_back(static_cast<int>(v));
      shadowElems += (val.type.numel() + 127) / 128 * 128; // 256-byte aligned
    }
  }
  // An aliased reshape's input and output are one buffer, so they must be
  // stored alike: where the rule above would differ (rank 1 vs >= 2, one of
  // them feeding grad_accumulate) the whole alias chain stays fp32, which
  // every kernel accepts. Only bf16 -> fp32 changes, so this terminates.
  // (The compiler applies the same rule to planned storage.)
  for (bool changed = !planned; changed;) {
    changed = false;
    for (const Block &b : p.blocks)
      for (const Instr &in : b.instrs)
        if (kernelHas(in.kernel, kMayAlias) && in.attrs.getInt("alias", 0) &&
            valueBf16_[in.inputs[0]] != valueBf16_[in.outputs[0]]) {
          valueBf16_[in.inputs[0]] = valueBf16_[in.outputs[0]] = 0;
          changed = true;
        }
  }
  shadows_.clear();
  shadowIndex_.clear();
  shadowPool_.reset(); // a program bound before
  if (!shadowVals.empty()) {
    shadowPool_.reset(static_cast<__nv_bfloat16 *>(deviceAlloc(shadowElems * 2)));
    size_t off = 0;
    for (int v : shadowVals) {
      const Value &val = p.values[v];
      Shadow s{reinterpret_cast<const float *>(poolBase_ + val.offset),
               shadowPool_ + off, val.type.numel()};
      shadowIndex_[s.master] = shadows_.size();
      shadows_.push_back(s);
      off += (val.type.numel() + 127) / 128 * 128;
    }
  }
  shadowsDirty_ = true;
  config_.fuse = CudaConfig::fusionFromEnv(); // may differ per program
  config_.fuseLog = CudaConfig::fuseLogFromEnv();
  fusions_ = planFusions(p, FusionSwitches{config_.fuse});
  optimChunks_.reset(); // the previous program's
  optimChunks_.reset(bindOptimGroups(*this, p, fusions_)); // needs the shadows
  fusedKernels_.reset(); // the previous program's
  fusedKernels_ = std::make_unique<FusedKernels>(*this, &p); // needs the storage
  if (config_.fuseLog)
    std::fprintf(stderr, "mapp cuda fusion: %s\n",
                 fusionSummary(*this).c_str());
}

FusedKernels &CudaBackend::fusedKernels() {
  if (!fusedKernels_) // calls outside a bound program (kernel tests)
    fusedKernels_ = std::make_unique<FusedKernels>(*this, nullptr);
  return *fusedKernels_;
}

DType CudaBackend::storedDType(const Program &p, const Instr &in, int value,
                               bool isOutput) {
  const Value &val = p.values[value];
  Tensor t{poolBase_ + val.offset, val.type}; // a pool value's address
  return operandView(p, in, value, isOutput, t).type.dtype;
}

Tensor CudaBackend::valueTensor(int value, const Tensor &anchor,
                                int anchorValue) const {
  const Value &v = prog_->values[value];
  uint8_t *base = poolBase_;
  if (inArena(v.kind)) // anchor.data = arena + slot · stride + its offset
    base = static_cast<uint8_t *>(anchor.data) - prog_->values[anchorValue].offset;
  Tensor t{base + v.offset, v.type};
  if (valueBf16_[value])
    t.type.dtype = DType::BF16;
  return t;
}

Tensor CudaBackend::operandView(const Program &p, const Instr &in, int value,
                                bool, const Tensor &t) {
  const Value &val = p.values[value];
  Tensor r = t;
  if (val.kind == ValueKind::Param && !isOptimizer(in.kernel)) {
    auto it = shadowIndex_.find(t.data);
    if (it != shadowIndex_.end()) {
      r.data = shadows_[it->second].copy;
      r.type.dtype = DType::BF16;
    }
    return r;
  }
  if (valueBf16_.size() > static_cast<size_t>(value) && valueBf16_[value])
    r.type.dtype = DType::BF16;
  return r;
}

__nv_bfloat16 *CudaBackend::shadowOf(const void *master) const {
  auto it = shadowIndex_.find(master);
  return it == shadowIndex_.end() ? nullptr : shadows_[it->second].copy;
}

void CudaBackend::refreshShadows() {
  for (const Shadow &s : shadows_)
    convertToBf16(s.master, s.copy, s.numel, stream_);
  shadowsDirty_ = false;
}

void CudaBackend::beginStep(int64_t step) {
  traceEvents_.beginStep(stream_); // first: the stream is still idle
  step_ = step;
  if (profile_ && step >= 1)
    ++profSteps_;
  if (shadowsDirty_)
    refreshShadows();
}

void CudaBackend::endStep() {
  // The optimizer kernels rewrite each shadow with its master (fused).
  flushProbes(); // one copy for the step's probe slots
  traceEvents_.endStep(stream_);
}

void CudaBackend::resolveTraceMarks(uint64_t *marks, size_t n) {
  // Runs on the executor's resolver thread: the device is per thread.
  MAPP_CUDA_CHECK(cudaSetDevice(device_));
  traceEvents_.resolve(marks, n);
}

AttnSaved &CudaBackend::attnSaved(const void *q, int64_t rows, int64_t numel,
                                  int oBf16) {
  AttnSaved &s = attn_[q];
  if (s.rows < rows) {
    notWhileCapturing("a saved-statistics buffer growing");
    dropGraphs();
    MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MAPP_CUDA_CHECK(cudaFree(s.lse));
    s.lse = static_cast<float *>(deviceAlloc(rows * sizeof(float)));
    s.rows = rows;
  }
  if (s.numel < numel || s.oBf16 != oBf16) {
    notWhileCapturing("a saved-attention buffer growing");
    dropGraphs();
    MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MAPP_CUDA_CHECK(cudaFree(s.o));
    s.o = deviceAlloc(numel * (oBf16 ? 2 : 4));
    s.numel = numel;
    s.oBf16 = oBf16;
  }
  return s;
}

AttnSaved *CudaBackend::findAttn(const void *q, const void *k, const void *v) {
  auto it = attn_.find(q);
  if (it == attn_.end() || it->second.q != q || it->second.k != k ||
      it->second.v != v)
    return nullptr;
  return &it->second;
}

CeSaved &CudaBackend::ceSaved(const void *logits, int64_t rows) {
  CeSaved &s = ce_[logits];
  if (s.rows < rows) {
    notWhileCapturing("a saved-statistics buffer growing");
    dropGraphs();
    MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MAPP_CUDA_CHECK(cudaFree(s.lse));
    s.lse = static_cast<float *>(deviceAlloc(rows * sizeof(float)));
    s.rows = rows;
  }
  if (!s.countDev)
    s.countDev = static_cast<int *>(deviceAlloc(sizeof(int)));
  return s;
}

CeSaved *CudaBackend::findCe(const void *logits, const void *targets) {
  auto it = ce_.find(logits);
  if (it == ce_.end() || it->second.logits != logits ||
      it->second.targets != targets)
    return nullptr;
  return &it->second;
}

void CudaBackend::profBegin(const char *name) {
  profStack_.push_back(profOpen_.size());
  if (step_ < 1) { // step 0 is warm-up (allocations, GEMM heuristics)
    profOpen_.push_back({nullptr, nullptr, nullptr});
    return;
  }
  while (profEvents_.size() < profNext_ + 2) {
    Event e;
    MAPP_CUDA_CHECK(cudaEventCreate(e.out()));
    profEvents_.push_back(std::move(e));
  }
  ProfRec r{name, profEvents_[profNext_], profEvents_[profNext_ + 1]};
  profNext_ += 2;
  MAPP_CUDA_CHECK(cudaEventRecord(r.a, stream_));
  profOpen_.push_back(r);
}

void CudaBackend::profEnd() {
  const ProfRec &r = profOpen_[profStack_.back()];
  profStack_.pop_back();
  if (r.name)
    MAPP_CUDA_CHECK(cudaEventRecord(r.b, stream_));
}

void CudaBackend::profCollect() {
  for (const ProfRec &r : profOpen_) {
    if (!r.name)
      continue;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, r.a, r.b) == cudaSuccess) {
      auto &t = profTotals_[r.name];
      t.first += ms;
      t.second += 1;
    }
  }
  profOpen_.clear();
  profNext_ = 0;
}

void CudaBackend::profReport() {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (auto &kv : profTotals_) {
    rows.push_back({kv.second.first, kv.first});
    if (kv.first[0] != ' ') // detail records lie inside a kernel's
      total += kv.second.first;
  }
  std::sort(rows.rbegin(), rows.rend());
  int64_t steps = std::max<int64_t>(profSteps_, 1);
  std::fprintf(stderr, "mapp cuda profile: %lld step(s), %.2f ms/step in kernels\n",
               static_cast<long long>(profSteps_), total / steps);
  for (auto &r : rows)
    std::fprintf(stderr, "  %-44s %9.3f ms/step %5.1f%%  %6lld calls/step\n",
                 r.second.c_str(), r.first / steps, 100 * r.first / total,
                 static_cast<long long>(profTotals_[r.second].second / steps));
}

std::unique_ptr<Backend> mapp::rt::createCudaBackend(int device) {
  return std::make_unique<CudaBackend>(device);
}
bool mapp::rt::cudaBackendBuilt() { return true; }
std::vector<std::string> mapp::rt::cudaKernelNames() {
  std::vector<std::string> names;
  for (const auto &kv : cudaKernelTable(false))
    names.push_back(kv.first);
  return names;
}

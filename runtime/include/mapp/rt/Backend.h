//===- Backend.h - kernel providers -----------------------------*- C++ -*-===//
//
// A backend maps kernel names to KernelFn once, at load time; the executor
// then calls function pointers. Storage is plain host memory for the CPU
// backend; a device backend will override allocate/free and the copies.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_BACKEND_H
#define MAPP_RT_BACKEND_H

#include "mapp/rt/Kernels.h"

#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

struct Program;
struct Instr;
struct Value;
class Communicator;

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  /// Null when this backend has no implementation of `kernel`.
  virtual KernelFn lookup(const std::string &kernel) const = 0;
  /// Zero-initialized storage of `bytes`, 64-byte aligned.
  virtual void *allocate(size_t bytes) = 0;
  virtual void release(void *p) = 0;
  virtual ThreadPool &pool() = 0;

  // --- Device storage. The defaults treat storage as host memory, so the CPU
  // backend overrides none of these; a device backend (CUDA) overrides them
  // and the executor never dereferences storage itself.

  /// Host bytes into storage (asynchronous for device backends; `src` may be
  /// reused as soon as the call returns).
  virtual void copyToStorage(void *dst, const void *src, size_t bytes);
  /// Storage bytes to the host, complete when the call returns.
  virtual void copyFromStorage(void *dst, const void *src, size_t bytes);
  /// A float scalar to the host; `*dst` is valid after synchronize().
  virtual void readScalarAsync(float *dst, const void *src);
  virtual void zeroStorage(void *dst, size_t bytes);
  /// Σ x² over float tensors in storage, accumulated in double.
  virtual double sumSquares(const std::vector<Tensor> &ts);
  /// Waits for queued work; reports asynchronous kernel errors as Error.
  virtual void synchronize() {}
  /// Orders work issued after this call behind the gradient collectives the
  /// backend left running asynchronously (grad_sync under NCCL overlaps the
  /// rest of the backward). The executor calls it once the backward is
  /// issued, before anything reads or writes the gradients again.
  virtual void waitComm() {}
  /// Peak device memory this process added since the backend started, in
  /// GiB, as seen at synchronize points (0 for host backends).
  virtual double peakDeviceGiB() const { return 0; }
  /// Storage bytes handed out by allocate() and not yet released: now and
  /// at the peak since the backend started (counted by the CPU backend,
  /// which allocates only the pool and the arenas; 0 where not counted).
  /// mapp-run --report-memory prints them beside the plan's figures.
  virtual uint64_t allocatedBytes() const { return 0; }
  virtual uint64_t peakAllocatedBytes() const { return 0; }
  /// Free device memory in bytes (the adaptive scheduler's default cap);
  /// 0 for host backends (no cap).
  virtual uint64_t freeDeviceBytes() const { return 0; }
  /// The device's name and memory in bytes ("" and 0 for host backends):
  /// mapp-run --calibrate's device kind and memory_gib.
  virtual std::string deviceName() const { return ""; }
  virtual uint64_t totalDeviceBytes() const { return 0; }
  /// Waits until every probe sample captured so far reached its
  /// ProbeRuntime (a device backend captures asynchronously).
  virtual void drainProbes() {}
  /// `n` floats of value `value` of `p` from element `offset`, whose storage
  /// is at `src`, as fp32 on the host (a backend may store it in bf16).
  virtual void readFloats(const Program &p, int value, const void *src,
                          int64_t offset, int64_t n, float *dst);
  /// The inverse of readFloats: `n` host fp32 values into value `value`
  /// from element `offset` (rounded to bf16 where the backend stores bf16).
  virtual void writeFloats(const Program &p, int value, void *dst,
                           int64_t offset, int64_t n, const float *src);

  /// Whether the backend stores values planned as bf16 (storage_bf16) as
  /// bf16 in their planned bytes; otherwise the executor runs such a program
  /// with fp32 storage (withF32Storage: twice the arena).
  virtual bool storesBf16() const { return false; }
  /// Called once by the executor after allocating the pool and the arenas,
  /// before instrs are bound: a device backend may decide how each value is
  /// stored (e.g. bf16 activations) and keep per-program state.
  virtual void bindProgram(const Program &, void * /*pool*/, void * /*arena*/) {}
  /// The tensor an instr operand sees; the default is the value's own view.
  /// A backend may rebind it (another dtype in the same slot, a shadow copy).
  virtual Tensor operandView(const Program &, const Instr &, int /*value*/,
                             bool /*isOutput*/, const Tensor &t) {
    return t;
  }
  // --- Posted receives: the adaptive scheduler posts every receive of a
  // step at its start into a host buffer and tests which have arrived.

  /// Bytes of the host message that a send of value `v` over `comm` makes,
  /// which is what a posted receive of it takes: the payload, or a device
  /// backend's small letter naming device memory the payload stays in.
  virtual size_t postedRecvBytes(Communicator &comm, const Value &v);
  /// Completes a posted receive into `out` from its arrived message `msg`
  /// (postedRecvBytes long). False when `msg` is the payload itself, which
  /// the caller then copies into storage.
  virtual bool takePostedRecv(Communicator & /*comm*/, const void * /*msg*/,
                              const Tensor & /*out*/, int /*peer*/,
                              int64_t /*tag*/) {
    return false;
  }

  /// Step boundaries (before the first task; after the optimizer).
  virtual void beginStep(int64_t /*step*/) {}
  virtual void endStep() {}

  // --- Step graphs (MAPP_CUDA_GRAPH, docs/cuda-graphs.md): a device backend
  // records the work queued between beginGraphCapture and endGraphCapture
  // as graph `id` instead of running it, and replays it with launchGraph.

  /// Whether steps should be captured (MAPP_CUDA_GRAPH=on) ...
  virtual bool stepGraphsAsked() const { return false; }
  /// ... and if so, why they cannot be ("" when they can).
  virtual std::string stepGraphsOff() const { return "the backend has no graphs"; }
  /// Pinned host memory of `bytes` at a fixed address per `index`: a
  /// captured copyToStorage reads its source there at every replay.
  virtual void *graphInput(int /*index*/, size_t /*bytes*/) { return nullptr; }
  virtual void beginGraphCapture() {}
  /// Ends the capture, instantiates it as graph `id` and launches it once.
  virtual void endGraphCapture(uint64_t /*id*/) {}
  /// Launches graph `id`; the scalar reads its capture queued
  /// (readScalarAsync, in order) land in `scalarDsts` this time. False
  /// (nothing launched) when the backend dropped it since: a buffer it
  /// points at moved (a scratch buffer grew in another key's warm-up).
  virtual bool launchGraph(uint64_t /*id*/,
                           const std::vector<float *> & /*scalarDsts*/) {
    return false;
  }
  virtual void dropGraph(uint64_t /*id*/) {}

  // --- Trace marks (MegaScan; docs/trace-format.md, "GPU timestamps"). The
  // executor marks each traced point as it issues the work around it. By
  // default a mark is the host's monotonic clock in ns, read at once. A
  // device backend whose work runs behind the host returns a handle instead
  // (traceMarksDeferred) and turns it into a host-clock time after the
  // step's end synchronize(), so the trace shows when the device ran the
  // work, not when the host queued it, without adding a wait to the step.

  /// True when traceMark() returns handles that need resolveTraceMarks.
  virtual bool traceMarksDeferred() const { return false; }
  /// A mark at this point of the backend's execution order.
  virtual uint64_t traceMark();
  /// Room for `n` marks per step, made before the first traced step so
  /// marking allocates nothing (the backend may still grow past it).
  virtual void reserveTraceMarks(size_t /*n*/) {}
  /// Replaces each mark of one finished step (after its end synchronize) by
  /// its host monotonic time in ns. A step's marks stay resolvable until the
  /// beginStep two steps later, and this may run on another thread than the
  /// one issuing the following step's work.
  virtual void resolveTraceMarks(uint64_t * /*marks*/, size_t /*n*/) {}
  /// The bank of deferred marks the current step records into (after
  /// beginStep), -1 without deferred marks. A step graph captured with
  /// marks records them again at each launch, into the events of the bank
  /// it was captured in: the executor keys graphs by bank, and launchGraph
  /// moves the bank past the marks its capture took.
  virtual int traceMarkBank() const { return -1; }
};

/// fp32 reference kernels with `threads` workers (0 = hardware threads).
std::unique_ptr<Backend> createCpuBackend(int threads);
/// bf16-compute CUDA backend on device `device` (docs/cuda-backend.md);
/// Error when the runtime was built without CUDA or no device is usable.
std::unique_ptr<Backend> createCudaBackend(int device);
/// True when this runtime was built with the CUDA backend.
bool cudaBackendBuilt();
/// The kernel names each backend registers, read without creating it (no
/// device needed): test/runtime-unit/KernelVocabTest.cpp compares them with
/// KernelVocab.def. cudaKernelNames() is empty when CUDA is not built.
std::vector<std::string> cpuKernelNames();
std::vector<std::string> cudaKernelNames();
/// Backend by name ("cpu", "cuda"); Error naming the choices otherwise.
/// `device`: the GPU of a device backend (ignored by cpu).
std::unique_ptr<Backend> createBackend(const std::string &name, int threads,
                                       int device = 0);

} // namespace mapp::rt

#endif

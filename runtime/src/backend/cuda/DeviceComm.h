//===- DeviceComm.h - collectives on device memory (internal) ---*- C++ -*-===//
//
// What the CUDA communication kernels call when the communicator can move
// device memory: flat blocks of float elements stored fp32 or bf16 (DView),
// ordered on the backend's compute stream. Two implementations:
//
//  - LocalDeviceComm (LocalDeviceComm.cu): the thread world with every rank
//    on one device; members' device pointers are exchanged through the host
//    communicator, reads are ordered by CUDA events, reductions run as
//    kernels that read every member's buffer.
//  - NcclDeviceComm (NcclComm.cu): NCCL on the rank's own GPU.
//
// The kernel layer (CommKernels.cu) adds tensor layouts (gather/scatter dims) and
// falls back to host staging when deviceCommOf() is null.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_CUDA_DEVICE_COMM_H
#define MAPP_RT_CUDA_DEVICE_COMM_H

#include "CudaCommon.h"
#include "mapp/rt/Comm.h"

#include <memory>
#include <vector>

namespace mapp::rt::cuda {

class CudaBackend;

class DeviceComm {
public:
  virtual ~DeviceComm() = default;
  /// In place over the group; every member gets bit-identical values.
  virtual void allReduce(DView buf, int64_t n, ReduceOp op,
                         const CommGroup &g) = 0;
  /// out = concatenation over members (member order) of their n elements.
  virtual void allGather(DView in, DView out, int64_t n,
                         const CommGroup &g) = 0;
  /// in holds size() blocks of n; out = reduction of every member's block i
  /// on member i.
  virtual void reduceScatter(DView in, DView out, int64_t n, ReduceOp op,
                             const CommGroup &g) = 0;
  /// in holds size() blocks of n; block j goes to member j, out's block i
  /// comes from member i.
  virtual void allToAll(DView in, DView out, int64_t n,
                        const CommGroup &g) = 0;
  /// Variable all-to-all of fp32 elements (ep_dispatch / ep_combine): in
  /// holds size() consecutive blocks, block j of sendElems[j] for member j;
  /// out gets block i of recvElems[i] from member i. The counts are already
  /// agreed (Communicator::agreeCounts). False: not supported here, the
  /// caller stages through the host communicator.
  virtual bool allToAllv(DView /*in*/, const std::vector<int64_t> & /*sendElems*/,
                         DView /*out*/, const std::vector<int64_t> & /*recvElems*/,
                         const CommGroup & /*g*/) {
    return false;
  }
  /// Eager send of n float elements to global rank `peer`: returns once the
  /// payload is captured (the caller may overwrite `in` afterwards).
  virtual void send(DView in, int64_t n, int peer, int64_t tag) = 0;
  virtual void recv(DView out, int64_t n, int peer, int64_t tag) = 0;
  /// Bytes of the host message a send makes when it is a letter naming
  /// device memory that holds the payload (a posted host receive of that
  /// size then takes it, and recvLetter finishes it); 0: no letters.
  virtual size_t letterBytes() const { return 0; }
  /// recv of a message whose letter (letterBytes long) already arrived.
  virtual void recvLetter(const void * /*letter*/, DView /*out*/,
                          int64_t /*n*/, int peer, int64_t tag) {
    fail("recv from rank ", peer, " (tag ", tag,
         "): this device communicator sends no letters");
  }

  // --- grad_sync: the dp bucket's collective, maybe left running so that it
  // overlaps the rest of the backward (docs/plan-lowering.md). The operands
  // are packed fp32 buffers. An overlapping communicator (NCCL) queues the
  // collective on a stream of its own after the compute stream's work so far
  // and returns that stream without ordering the compute stream after it:
  // the caller queues the work that reads the result (the unpack) there,
  // and fence() orders the compute stream after all of it. The default is
  // synchronous: the plain collective, then the compute stream.
  // LocalDeviceComm keeps it: its collectives are rendezvous through the host
  // communicator (pointers and events exchanged by a blocking all_to_all), so
  // the host thread waits for every member anyway.

  /// In place over the group, like allReduce.
  virtual cudaStream_t startGradAllReduce(DView buf, int64_t n, ReduceOp op,
                                          const CommGroup &g,
                                          cudaStream_t compute) {
    allReduce(buf, n, op, g);
    return compute;
  }
  /// Like reduceScatter.
  virtual cudaStream_t startGradReduceScatter(DView in, DView out, int64_t n,
                                              ReduceOp op, const CommGroup &g,
                                              cudaStream_t compute) {
    reduceScatter(in, out, n, op, g);
    return compute;
  }
  /// An fp32 buffer of n elements for part `part` (0: the packed bucket,
  /// 1: the reduce-scatter result) of the bucket whose first operand is at
  /// `bucket`, untouched by anything else until fence(): a buffer the
  /// collective still reads after grad_sync returns cannot be a scratch
  /// slot the next kernel reuses. Null: synchronous, use the backend's
  /// scratch.
  virtual void *gradBucketBuffer(const void * /*bucket*/, int /*part*/,
                                 int64_t /*n*/) {
    return nullptr;
  }
  /// Orders the compute stream after every grad collective started so far
  /// and the work queued behind it (Backend::waitComm).
  virtual void fence() {}
};

/// The most members one device collective takes (kernel parameter space).
constexpr int kMaxDeviceGroup = 64;

std::unique_ptr<DeviceComm> createLocalDeviceComm(CudaBackend &be,
                                                  Communicator &host);
#ifdef MAPP_HAVE_NCCL
std::unique_ptr<DeviceComm> createNcclDeviceComm(CudaBackend &be,
                                                 Communicator &host);
#endif

/// A float view `off` elements into v.
inline DView offsetView(DView v, int64_t off) {
  return {static_cast<char *>(v.p) + off * (v.bf16 ? 2 : 4), v.bf16};
}

} // namespace mapp::rt::cuda

#endif

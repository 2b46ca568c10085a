//===- NcclComm.cu - the NCCL communicator (--comm=nccl) ------------------===//
//
// One process, one thread per rank, rank r on GPU r (ncclDeviceOf). The
// world's NCCL communicators come from ncclCommInitAll; each rank's device
// collectives split them into its tp/dp/pp groups (ncclCommSplit, collective
// over the world: every rank splits in the same order on its first
// communication kernel). NCCL work runs on a stream of its own per rank,
// ordered with the compute stream by events on both sides — except for
// grad_sync's collectives, which the compute stream does not wait for until
// fence() (Backend::waitComm, before the gradient norm and the optimizer),
// so that the dp gradient all-reduce overlaps the rest of the backward.
// MAPP_NCCL_SYNC_GRADS=1 makes them synchronous like every other collective
// (same NCCL calls on the same data: bit-identical results).
//
// Host side: NcclComm is a Communicator over a thread world (LocalComm), so
// the executor's host collectives, rendezvous, timeouts and abort handling
// are those of --comm=local. Point-to-point (pipeline send/recv) also goes
// through that host world: NCCL's send/recv are rendezvous and match in
// issue order, which a 1F1B schedule's crossing sends would deadlock on;
// the host mailbox is eager and tag-matched.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "DeviceComm.h"

#include "mapp/rt/Launcher.h"
#include "mapp/rt/Rendezvous.h"

#include <nccl.h>

#include <cstdio>
#include <cstring>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

#define MAPP_NCCL_CHECK(expr)                                                  \
  do {                                                                         \
    ncclResult_t r_ = (expr);                                                  \
    if (r_ != ncclSuccess)                                                     \
      ::mapp::rt::fail("NCCL error in ", #expr, ": ", ncclGetErrorString(r_)); \
  } while (0)

namespace {

/// The NCCL communicators of one world (thread or process): destroyed
/// together, or aborted together when a rank fails.
class NcclHandles {
public:
  ~NcclHandles() {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_)
      for (ncclComm_t c : owned_)
        ncclCommDestroy(c);
  }
  /// Records a communicator (destroyed or aborted with the world).
  void own(ncclComm_t c) {
    std::lock_guard<std::mutex> lk(mu_);
    owned_.push_back(c);
  }
  /// Aborts every communicator, so that a rank blocked in an NCCL kernel
  /// waiting for a dead peer returns instead of hanging; once only.
  void abort(int rank, const std::string &why) {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_)
      return;
    aborted_ = true;
    failed_ = "rank " + std::to_string(rank) + " failed (" + why + ")";
    for (ncclComm_t c : owned_)
      ncclCommAbort(c);
  }
  /// Throws once the world was aborted (its communicators are gone).
  void check(const char *what) {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_)
      fail(what, ": ", failed_);
  }

private:
  std::mutex mu_;
  std::vector<ncclComm_t> owned_;
  bool aborted_ = false;
  std::string failed_;
};

/// One rank's native state: what deviceImpl() returns.
struct NcclRank {
  NcclHandles *world = nullptr;
  ncclComm_t comm = nullptr;
  int device = 0;
};

class NcclWorld final : public LocalWorld {
public:
  explicit NcclWorld(int n) : host_(createLocalWorld(n)), ranks_(n) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess)
      count = 0;
    std::vector<int> devices(n);
    for (int r = 0; r < n; ++r)
      devices[r] = ncclDeviceOf(r, n, count);
    std::vector<ncclComm_t> comms(n);
    MAPP_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
    for (int r = 0; r < n; ++r) {
      ranks_[r] = {&handles_, comms[r], devices[r]};
      handles_.own(comms[r]);
    }
  }
  int size() const override { return host_->size(); }
  std::unique_ptr<Communicator> connect(int rank) override;
  /// Fails the host world (ranks blocked on the host get an Error naming
  /// `rank`) and aborts every NCCL communicator, so that ranks blocked in an
  /// NCCL kernel waiting for the dead one return instead of hanging.
  void abort(int rank, const std::string &why) override {
    host_->abort(rank, why);
    handles_.abort(rank, why);
  }

private:
  NcclHandles handles_; // destroyed after host_ and ranks_ (declared first)
  std::unique_ptr<LocalWorld> host_;
  std::vector<NcclRank> ranks_;
};

/// Host operations go to the thread world's communicator; the NCCL handles
/// ride along for the CUDA backend.
class NcclComm final : public Communicator {
public:
  NcclComm(std::unique_ptr<Communicator> host, NcclRank *rank)
      : host_(std::move(host)), rank_(rank) {}
  std::string name() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int worldSize() const override { return host_->worldSize(); }
  void allReduce(float *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    inner().allReduce(b, n, op, g);
  }
  void allReduce(double *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    inner().allReduce(b, n, op, g);
  }
  void allGather(const float *in, float *out, int64_t n,
                 const CommGroup &g) override {
    inner().allGather(in, out, n, g);
  }
  void reduceScatter(const float *in, float *out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    inner().reduceScatter(in, out, n, op, g);
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    inner().allToAll(in, out, bytes, g);
  }
  void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                 void *out, const std::vector<uint64_t> &recvBytes,
                 const CommGroup &g) override {
    inner().allToAllv(in, sendBytes, out, recvBytes, g);
  }
  void send(const void *buf, size_t bytes, int peer, int64_t tag) override {
    inner().send(buf, bytes, peer, tag);
  }
  void recv(void *buf, size_t bytes, int peer, int64_t tag) override {
    inner().recv(buf, bytes, peer, tag);
    lastRecv_ = host_->lastRecvStamps();
  }
  // Asynchronous point-to-point of host buffers: the thread world's posted
  // receives (device payloads are staged by the caller).
  P2PHandle isend(const void *buf, size_t bytes, int peer,
                  int64_t tag) override {
    return inner().isend(buf, bytes, peer, tag);
  }
  P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override {
    return inner().irecv(buf, bytes, peer, tag);
  }
  bool test(P2PRequest &r) override { return inner().test(r); }
  int waitAny(const std::vector<P2PRequest *> &reqs,
              uint64_t deadlineNs) override {
    return inner().waitAny(reqs, deadlineNs);
  }
  void cancel(P2PRequest &r) override { inner().cancel(r); }
  void barrier() override { inner().barrier(); }
  void flush() override { inner().flush(); }
  bool sharesAddressSpace() const override { return true; }
  bool sharesClockWith(int) const override { return true; }
  void *deviceImpl() const override { return rank_; }
  int deviceOrdinal() const override { return rank_->device; }

private:
  /// setTimeout is not virtual: carry this communicator's timeout along.
  Communicator &inner() {
    host_->setTimeout(timeout());
    return *host_;
  }
  std::unique_ptr<Communicator> host_;
  NcclRank *rank_;
};

std::unique_ptr<Communicator> NcclWorld::connect(int rank) {
  return std::make_unique<NcclComm>(host_->connect(rank), &ranks_.at(rank));
}

/// One rank of NCCL processes: host operations go to the process world's
/// host communicator (MPI, or none at world size 1); the rank's NCCL world
/// communicator, made by ncclCommInitRank from the rendezvoused id, rides
/// along for the CUDA backend.
class NcclProcessComm final : public Communicator {
public:
  NcclProcessComm(std::unique_ptr<Communicator> host, int device,
                  ncclComm_t comm)
      : host_(std::move(host)) {
    rank_ = {&handles_, comm, device};
    handles_.own(comm);
  }
  std::string name() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int worldSize() const override { return host_->worldSize(); }
  void allReduce(float *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    guard([&] { inner().allReduce(b, n, op, g); });
  }
  void allReduce(double *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    guard([&] { inner().allReduce(b, n, op, g); });
  }
  void allGather(const float *in, float *out, int64_t n,
                 const CommGroup &g) override {
    guard([&] { inner().allGather(in, out, n, g); });
  }
  void reduceScatter(const float *in, float *out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    guard([&] { inner().reduceScatter(in, out, n, op, g); });
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    guard([&] { inner().allToAll(in, out, bytes, g); });
  }
  void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                 void *out, const std::vector<uint64_t> &recvBytes,
                 const CommGroup &g) override {
    guard([&] { inner().allToAllv(in, sendBytes, out, recvBytes, g); });
  }
  void send(const void *buf, size_t bytes, int peer, int64_t tag) override {
    guard([&] { inner().send(buf, bytes, peer, tag); });
  }
  void recv(void *buf, size_t bytes, int peer, int64_t tag) override {
    guard([&] { inner().recv(buf, bytes, peer, tag); });
    lastRecv_ = host_->lastRecvStamps();
  }
  P2PHandle isend(const void *buf, size_t bytes, int peer,
                  int64_t tag) override {
    return guard([&] { return inner().isend(buf, bytes, peer, tag); });
  }
  P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override {
    return guard([&] { return inner().irecv(buf, bytes, peer, tag); });
  }
  bool test(P2PRequest &r) override {
    return guard([&] { return inner().test(r); });
  }
  int waitAny(const std::vector<P2PRequest *> &reqs,
              uint64_t deadlineNs) override {
    return guard([&] { return inner().waitAny(reqs, deadlineNs); });
  }
  void cancel(P2PRequest &r) override { inner().cancel(r); }
  void setStep(int64_t s) override { host_->setStep(s); }
  void barrier() override { guard([&] { inner().barrier(); }); }
  void progress() override { guard([&] { host_->progress(); }); }
  void flush() override { guard([&] { inner().flush(); }); }
  bool sharesClockWith(int peer) const override {
    return host_->sharesClockWith(peer);
  }
  int ranksOnThisHost() const override { return host_->ranksOnThisHost(); }
  void *deviceImpl() const override { return &rank_; }
  int deviceOrdinal() const override { return rank_.device; }

private:
  Communicator &inner() {
    host_->setTimeout(timeout());
    host_->setLayout(layout());
    return *host_;
  }
  /// A host call that fails (a peer died or timed out: the MPI world names
  /// it) aborts this rank's NCCL communicators first, so that kernels still
  /// waiting for that peer end and the unwinding (stream synchronizes in
  /// the backend's destructor) cannot hang.
  template <typename F> auto guard(F f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception &e) {
      handles_.abort(rank(), e.what());
      throw;
    }
  }
  NcclHandles handles_; // destroyed last: the NCCL communicators
  std::unique_ptr<Communicator> host_;
  mutable NcclRank rank_;
};

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
  case ReduceOp::Sum:
    return ncclSum;
  case ReduceOp::Max:
    return ncclMax;
  case ReduceOp::Avg:
    return ncclAvg;
  }
  return ncclSum;
}

/// Scratch buffers of the fp32 copies of bf16 operands (NCCL reduces fp32:
/// bf16 on the wire would round at every hop).
constexpr int kInScratch = 5, kOutScratch = 1;

class NcclDeviceComm final : public DeviceComm {
public:
  NcclDeviceComm(CudaBackend &be, Communicator &host, NcclRank &nr)
      : be_(be), host_(host), nr_(nr), overlapGrads_(!be.config().ncclSyncGrads) {
    MAPP_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
    MAPP_CUDA_CHECK(cudaEventCreateWithFlags(computeDone_.out(), cudaEventDisableTiming));
    MAPP_CUDA_CHECK(cudaEventCreateWithFlags(ncclDone_.out(), cudaEventDisableTiming));
    int world = host.worldSize(), r = host.rank();
    Layout l = host.layout();
    if (l.world() != world)
      l = Layout{world, 1, 1};
    comms_[l.members(Group::World, r)] = nr.comm;
    // Collective over the world: every rank splits tp, dp, pp in this order;
    // a group's color is its lowest rank, members keep their global order.
    // With ep in the layout, the expert groups too (every rank alike).
    for (Group g : {Group::TP, Group::DP, Group::PP, Group::EP, Group::EDP}) {
      if ((g == Group::EP || g == Group::EDP) && l.ep <= 0)
        continue;
      std::vector<int> members = l.members(g, r);
      ncclComm_t c = nullptr;
      nr.world->check("nccl: splitting the world");
      MAPP_NCCL_CHECK(ncclCommSplit(nr.comm, members[0], r, &c, nullptr));
      nr.world->own(c);
      comms_.emplace(members, c);
    }
  }
  ~NcclDeviceComm() override {
    cudaStreamSynchronize(stream_);
    for (auto &[key, buf] : gradBuffers_)
      cudaFree(buf.p);
  } // then the owned events and stream (CudaHandles.h)

  void allReduce(DView buf, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    if (g.size() == 1)
      return;
    ncclComm_t c = commOf(g, "all_reduce");
    DView f = asF32(buf, n, kInScratch);
    begin();
    MAPP_NCCL_CHECK(ncclAllReduce(f.p, f.p, n, ncclFloat, ncclOp(op), c, stream_));
    end();
    if (buf.bf16)
      copyConvert(f, buf, n, be_.stream());
  }

  void allGather(DView in, DView out, int64_t n, const CommGroup &g) override {
    ncclComm_t c = commOf(g, "all_gather");
    DView fi = asF32(in, n, kInScratch), fo = outF32(out, n * g.size());
    begin();
    MAPP_NCCL_CHECK(ncclAllGather(fi.p, fo.p, n, ncclFloat, c, stream_));
    end();
    if (out.bf16)
      copyConvert(fo, out, n * g.size(), be_.stream());
  }

  void reduceScatter(DView in, DView out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    ncclComm_t c = commOf(g, "reduce_scatter");
    DView fi = asF32(in, n * g.size(), kInScratch), fo = outF32(out, n);
    begin();
    MAPP_NCCL_CHECK(
        ncclReduceScatter(fi.p, fo.p, n, ncclFloat, ncclOp(op), c, stream_));
    end();
    if (out.bf16)
      copyConvert(fo, out, n, be_.stream());
  }

  void allToAll(DView in, DView out, int64_t n, const CommGroup &g) override {
    ncclComm_t c = commOf(g, "all_to_all");
    int m = g.size();
    DView fi = asF32(in, n * m, kInScratch), fo = outF32(out, n * m);
    begin();
    MAPP_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < m; ++i) {
      MAPP_NCCL_CHECK(ncclSend(offsetView(fi, i * n).p, n, ncclFloat, i, c, stream_));
      MAPP_NCCL_CHECK(ncclRecv(offsetView(fo, i * n).p, n, ncclFloat, i, c, stream_));
    }
    MAPP_NCCL_CHECK(ncclGroupEnd());
    end();
    if (out.bf16)
      copyConvert(fo, out, n * m, be_.stream());
  }

  // One ncclSend/ncclRecv pair per member in a group call, sizes per pair
  // (zero-sized pairs skipped: NCCL matches sends and receives by count).
  bool allToAllv(DView in, const std::vector<int64_t> &sendElems, DView out,
                 const std::vector<int64_t> &recvElems,
                 const CommGroup &g) override {
    // bf16 operands and ep groups that are not a layout group (ep < dp:
    // explicit ranks) are staged by the caller.
    if (in.bf16 || out.bf16 || !comms_.count(g.members))
      return false;
    ncclComm_t c = commOf(g, "all_to_allv");
    int m = g.size();
    begin();
    MAPP_NCCL_CHECK(ncclGroupStart());
    int64_t so = 0, ro = 0;
    for (int i = 0; i < m; ++i) {
      if (sendElems[i])
        MAPP_NCCL_CHECK(ncclSend(offsetView(in, so).p, sendElems[i], ncclFloat,
                                 i, c, stream_));
      if (recvElems[i])
        MAPP_NCCL_CHECK(ncclRecv(offsetView(out, ro).p, recvElems[i],
                                 ncclFloat, i, c, stream_));
      so += sendElems[i];
      ro += recvElems[i];
    }
    MAPP_NCCL_CHECK(ncclGroupEnd());
    end();
    return true;
  }

  // Point-to-point through the host world (see the file comment).
  void send(DView in, int64_t n, int peer, int64_t tag) override {
    std::vector<float> h(std::max<int64_t>(n, 1));
    DView f = asF32(in, n, kInScratch);
    be_.copyFromStorage(h.data(), f.p, n * 4);
    host_.send(h.data(), n * 4, peer, tag);
  }
  void recv(DView out, int64_t n, int peer, int64_t tag) override {
    std::vector<float> h(std::max<int64_t>(n, 1));
    host_.recv(h.data(), n * 4, peer, tag);
    DView f = outF32(out, n);
    MAPP_CUDA_CHECK(cudaMemcpyAsync(f.p, h.data(), n * 4,
                                    cudaMemcpyHostToDevice, be_.stream()));
    if (out.bf16)
      copyConvert(f, out, n, be_.stream());
    MAPP_CUDA_CHECK(cudaStreamSynchronize(be_.stream())); // h dies here
  }

  cudaStream_t startGradAllReduce(DView buf, int64_t n, ReduceOp op,
                                  const CommGroup &g,
                                  cudaStream_t compute) override {
    if (!overlapGrads_)
      return DeviceComm::startGradAllReduce(buf, n, op, g, compute);
    if (buf.bf16)
      fail("grad_sync: the packed bucket must be fp32");
    ncclComm_t c = commOf(g, "grad_sync");
    begin();
    MAPP_NCCL_CHECK(ncclAllReduce(buf.p, buf.p, n, ncclFloat, ncclOp(op), c, stream_));
    gradsPending_ = true;
    return stream_;
  }

  cudaStream_t startGradReduceScatter(DView in, DView out, int64_t n,
                                      ReduceOp op, const CommGroup &g,
                                      cudaStream_t compute) override {
    if (!overlapGrads_)
      return DeviceComm::startGradReduceScatter(in, out, n, op, g, compute);
    if (in.bf16 || out.bf16)
      fail("grad_sync: the packed bucket must be fp32");
    ncclComm_t c = commOf(g, "grad_sync");
    begin();
    MAPP_NCCL_CHECK(
        ncclReduceScatter(in.p, out.p, n, ncclFloat, ncclOp(op), c, stream_));
    gradsPending_ = true;
    return stream_;
  }

  /// One device buffer per (bucket, part), kept for the run: the scratch
  /// slots are reused by the next kernels on the compute stream while the
  /// collective still reads or writes its buffer.
  void *gradBucketBuffer(const void *bucket, int part, int64_t n) override {
    if (!overlapGrads_)
      return nullptr;
    size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * 4;
    GradBuffer &b = gradBuffers_[{bucket, part}];
    if (b.bytes < bytes) {
      // Only on a bucket's first use (its size is fixed by the plan); the
      // old buffer may still be in flight on the NCCL stream.
      MAPP_CUDA_CHECK(cudaStreamSynchronize(stream_));
      if (b.p)
        MAPP_CUDA_CHECK(cudaFree(b.p));
      b.p = nullptr;
      MAPP_CUDA_CHECK(cudaMalloc(&b.p, bytes));
      b.bytes = bytes;
    }
    return b.p;
  }

  void fence() override {
    if (!gradsPending_)
      return;
    gradsPending_ = false;
    end();
  }

private:
  ncclComm_t commOf(const CommGroup &g, const char *what) {
    nr_.world->check(what);
    auto it = comms_.find(g.members);
    if (it == comms_.end())
      fail(what, " over ", g.str(), ": --comm=nccl runs collectives over the "
           "layout's tp, dp, pp and world groups only (--comm=local takes "
           "any rank list)");
    return it->second;
  }
  DView asF32(DView v, int64_t n, int which) {
    if (!v.bf16)
      return v;
    DView f{be_.scratch(std::max<int64_t>(n, 1) * 4, which), 0};
    copyConvert(v, f, n, be_.stream());
    return f;
  }
  DView outF32(DView v, int64_t n) {
    return v.bf16 ? DView{be_.scratch(std::max<int64_t>(n, 1) * 4, kOutScratch), 0}
                  : v;
  }
  /// NCCL work starts after the compute stream's work so far...
  void begin() {
    MAPP_CUDA_CHECK(cudaEventRecord(computeDone_, be_.stream()));
    MAPP_CUDA_CHECK(cudaStreamWaitEvent(stream_, computeDone_, 0));
  }
  /// ...and the compute stream continues after it (and after any grad_sync
  /// collective queued before it: one stream).
  void end() {
    gradsPending_ = false;
    MAPP_CUDA_CHECK(cudaEventRecord(ncclDone_, stream_));
    MAPP_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), ncclDone_, 0));
  }

  CudaBackend &be_;
  Communicator &host_;
  NcclRank &nr_;
  Stream stream_;
  Event computeDone_, ncclDone_;
  std::map<std::vector<int>, ncclComm_t> comms_;
  /// False under MAPP_NCCL_SYNC_GRADS=1.
  const bool overlapGrads_;
  /// A grad_sync collective was queued since the compute stream last waited
  /// for the NCCL stream.
  bool gradsPending_ = false;
  struct GradBuffer {
    void *p = nullptr;
    size_t bytes = 0;
  };
  std::map<std::pair<const void *, int>, GradBuffer> gradBuffers_;
};

} // namespace

bool mapp::rt::haveNcclComm() { return true; }

std::unique_ptr<LocalWorld> mapp::rt::createNcclWorld(int worldSize) {
  if (worldSize < 1)
    fail("--comm=nccl needs at least one rank");
  return std::make_unique<NcclWorld>(worldSize);
}

std::unique_ptr<Communicator>
mapp::rt::createNcclProcessComm(const LauncherEnv &l,
                                std::unique_ptr<Communicator> host) {
  if (host->worldSize() != l.world || host->rank() != l.rank)
    fail("--comm=nccl: the host communicator says rank ", host->rank(), " of ",
         host->worldSize(), ", ", l.launcher, " rank ", l.rank, " of ",
         l.world);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess)
    count = 0;
  int device = launcherDevice(l.localRank, l.localWorld, count,
                              std::getenv("CUDA_VISIBLE_DEVICES"));
  MAPP_CUDA_CHECK(cudaSetDevice(device));
  // NVLink SHARP multicast stays off (a failed probe hangs init on the lent
  // machines); a user's setting wins.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId id{};
  Blob blob;
  if (l.rank == 0) {
    MAPP_NCCL_CHECK(ncclGetUniqueId(&id));
    blob.assign(reinterpret_cast<uint8_t *>(&id),
                reinterpret_cast<uint8_t *>(&id) + sizeof id);
  }
  std::string how = rendezvousPath(l, processEnv());
  if (how == "tcp")
    how += l.masterPort ? " " + l.masterAddr + ":" + std::to_string(l.masterPort)
                        : " (not needed: one process)";
  if (l.rank == 0)
    std::fprintf(stderr,
                 "mapp-run: NCCL processes (%s): %d rank(s), rank 0 on GPU "
                 "%d, NCCL id by %s\n",
                 l.launcher.c_str(), l.world, device, how.c_str());
  blob = rendezvous(l, processEnv(), blob);
  if (blob.size() != sizeof id)
    fail("--comm=nccl: rank ", l.rank, " got a ", blob.size(),
         "-byte NCCL id from rank 0 (", sizeof id, " expected)");
  std::memcpy(&id, blob.data(), sizeof id);
  ncclComm_t comm = nullptr;
  MAPP_NCCL_CHECK(ncclCommInitRank(&comm, l.world, id, l.rank));
  return std::make_unique<NcclProcessComm>(std::move(host), device, comm);
}

std::unique_ptr<DeviceComm> cuda::createNcclDeviceComm(CudaBackend &be,
                                                       Communicator &host) {
  return std::make_unique<NcclDeviceComm>(
      be, host, *static_cast<NcclRank *>(host.deviceImpl()));
}

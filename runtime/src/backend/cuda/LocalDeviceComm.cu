//===- LocalDeviceComm.cu - rank-threads sharing one device ---------------===//
//
// The thread world (LocalComm.cpp) with every rank's CudaBackend on the same
// device: payloads never leave the device. The host communicator only
// rendezvouses: a collective is a sequence of phases, and each phase
//
//   records this rank's phase event on its compute stream,
//   publishes (device pointers, element count, event) to the group through
//     the host communicator's all_to_all (a barrier with its timeout and
//     abort handling: a dead rank is an Error naming it, never a hang),
//   makes the compute stream wait for every other member's event,
//
// so a member reads another's buffer only after the producer's writes, and
// writes its own buffers again only after everybody's reads. all_reduce is
// reduce-scatter + all-gather like the host world: member i reduces elements
// [n*i/m, n*(i+1)/m) of every member's buffer in member order in double
// into its stage (fp32), then every member copies all stages back, so all
// members get bit-identical values equal to the host world's.
//
// Events are per (rank, group) and per phase: an event is recorded again
// only after a later exchange of the same group, which every member enters
// after issuing its waits on the previous recording.
//
// send is eager: the payload is copied (on the sender's stream) into a
// device mailbox slot and a small letter naming the slot goes through the
// host communicator's send, which keeps (src, dst, tag) order; recv takes
// the letter, waits for the slot's copy, converts into its output and hands
// the slot back once its stream has read it. The adaptive scheduler posts a
// letter-sized host receive at the step's start and finishes it with
// recvLetter once it arrived: its payloads stay on the device too.
//
//===----------------------------------------------------------------------===//
#include "CudaBackend.h"
#include "DeviceComm.h"

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

using namespace mapp::rt;
using namespace mapp::rt::cuda;

namespace {

/// Scratch buffer of the all_reduce stage (CudaBackend::scratch convention).
constexpr int kStageScratch = 5;

struct Members {
  DView v[kMaxDeviceGroup];
  int n;
};

/// out[i] = reduction over members m (in order) of in.v[m][off + i], in
/// double, rounded once.
__global__ void reduceMembers(Members in, int64_t off, DView out, int64_t n,
                              int op) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    double acc = in.v[0].ld(off + i);
    for (int m = 1; m < in.n; ++m) {
      double v = in.v[m].ld(off + i);
      acc = op == int(ReduceOp::Max) ? fmax(acc, v) : acc + v;
    }
    if (op == int(ReduceOp::Avg))
      acc /= in.n;
    out.st(i, static_cast<float>(acc));
  }
}

/// What a member publishes in one phase.
struct Published {
  void *in;
  void *stage;
  int64_t n;
  int inBf16;
  cudaEvent_t ready;
};

/// A device buffer that carries one message from a send to its recv.
struct MailSlot {
  void *p = nullptr;
  size_t cap = 0;
  int device = 0;
  bool used = false;
  cudaEvent_t ready = nullptr, consumed = nullptr;
};

/// The process's mailbox slots, shared by every rank-thread: a slot goes
/// from a sender to a receiver and back to the pool. Deliberately never
/// freed: it outlives every rank's backend, and the process ends with it.
class Mailbox {
public:
  MailSlot *take(size_t bytes, int device) {
    std::lock_guard<std::mutex> lk(mu_);
    MailSlot *best = nullptr;
    size_t at = 0;
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i]->device == device && free_[i]->cap >= bytes &&
          (!best || free_[i]->cap < best->cap))
        best = free_[i], at = i;
    if (best) {
      free_.erase(free_.begin() + at);
      return best;
    }
    auto *s = new MailSlot;
    s->cap = std::max<size_t>(bytes, 256);
    s->device = device;
    MAPP_CUDA_CHECK(cudaMalloc(&s->p, s->cap));
    MAPP_CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    MAPP_CUDA_CHECK(
        cudaEventCreateWithFlags(&s->consumed, cudaEventDisableTiming));
    return s;
  }
  void give(MailSlot *s) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(s);
  }

private:
  std::mutex mu_;
  std::vector<MailSlot *> free_;
};

Mailbox &mailbox() {
  static Mailbox *m = new Mailbox;
  return *m;
}

/// What travels through the host communicator for one send.
struct Letter {
  MailSlot *slot;
  int64_t n;
  int bf16;
};

class LocalDeviceComm final : public DeviceComm {
public:
  LocalDeviceComm(CudaBackend &be, Communicator &host) : be_(be), host_(host) {}
  ~LocalDeviceComm() override {
    for (auto &[k, evs] : events_)
      for (cudaEvent_t e : evs)
        cudaEventDestroy(e);
  }

  void allReduce(DView buf, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    int m = g.size(), idx = memberIndex(g, "all_reduce");
    if (m == 1)
      return;
    int64_t lo = n * idx / m, hi = n * (idx + 1) / m;
    void *stage = be_.scratch(std::max<int64_t>(hi - lo, 1) * 4, kStageScratch);
    std::vector<Published> all =
        phase(g, 0, "all_reduce", {buf.p, stage, n, buf.bf16, nullptr});
    if (hi > lo)
      reduceMembers<<<gridFor(hi - lo, 256), 256, 0, be_.stream()>>>(
          membersOf(all), lo, DView{stage, 0}, hi - lo, int(op));
    MAPP_CUDA_LAUNCHED();
    // Every chunk reduced, every input read: overwrite in place.
    all = phase(g, 1, "all_reduce", {buf.p, stage, n, buf.bf16, nullptr});
    for (int i = 0; i < m; ++i) {
      int64_t l = n * i / m, h = n * (i + 1) / m;
      if (h > l)
        copyConvert({all[i].stage, 0}, offsetView(buf, l), h - l, be_.stream());
    }
    // Nobody reuses its stage before everybody has copied it.
    phase(g, 2, "all_reduce", {buf.p, stage, n, buf.bf16, nullptr});
  }

  void allGather(DView in, DView out, int64_t n, const CommGroup &g) override {
    int m = g.size();
    memberIndex(g, "all_gather");
    std::vector<Published> all =
        phase(g, 0, "all_gather", {in.p, nullptr, n, in.bf16, nullptr});
    for (int i = 0; i < m; ++i)
      copyConvert({all[i].in, all[i].inBf16}, offsetView(out, i * n), n,
                  be_.stream());
    phase(g, 1, "all_gather", {in.p, nullptr, n, in.bf16, nullptr});
  }

  void reduceScatter(DView in, DView out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    int idx = memberIndex(g, "reduce_scatter");
    std::vector<Published> all =
        phase(g, 0, "reduce_scatter", {in.p, nullptr, n, in.bf16, nullptr});
    if (n > 0)
      reduceMembers<<<gridFor(n, 256), 256, 0, be_.stream()>>>(
          membersOf(all), idx * n, out, n, int(op));
    MAPP_CUDA_LAUNCHED();
    phase(g, 1, "reduce_scatter", {in.p, nullptr, n, in.bf16, nullptr});
  }

  void allToAll(DView in, DView out, int64_t n, const CommGroup &g) override {
    int m = g.size(), idx = memberIndex(g, "all_to_all");
    std::vector<Published> all =
        phase(g, 0, "all_to_all", {in.p, nullptr, n, in.bf16, nullptr});
    for (int i = 0; i < m; ++i)
      copyConvert(offsetView({all[i].in, all[i].inBf16}, idx * n),
                  offsetView(out, i * n), n, be_.stream());
    phase(g, 1, "all_to_all", {in.p, nullptr, n, in.bf16, nullptr});
  }

  void send(DView in, int64_t n, int peer, int64_t tag) override {
    if (peer < 0 || peer >= host_.worldSize() || peer == host_.rank())
      fail("send from rank ", host_.rank(), " to rank ", peer, " (tag ", tag,
           "): no such peer in a world of ", host_.worldSize());
    size_t bytes = static_cast<size_t>(n) * (in.bf16 ? 2 : 4);
    MailSlot *s = mailbox().take(bytes, be_.device());
    if (s->used) // the previous receiver's copy out of the slot
      MAPP_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), s->consumed, 0));
    s->used = true;
    if (bytes)
      MAPP_CUDA_CHECK(cudaMemcpyAsync(s->p, in.p, bytes,
                                      cudaMemcpyDeviceToDevice, be_.stream()));
    MAPP_CUDA_CHECK(cudaEventRecord(s->ready, be_.stream()));
    Letter l{s, n, in.bf16};
    try {
      host_.send(&l, sizeof l, peer, tag);
    } catch (...) {
      mailbox().give(s);
      throw;
    }
  }

  void recv(DView out, int64_t n, int peer, int64_t tag) override {
    Letter l{};
    host_.recv(&l, sizeof l, peer, tag);
    recvLetter(&l, out, n, peer, tag);
  }

  size_t letterBytes() const override { return sizeof(Letter); }

  void recvLetter(const void *letter, DView out, int64_t n, int peer,
                  int64_t tag) override {
    Letter l;
    std::memcpy(&l, letter, sizeof l);
    if (l.n != n) {
      mailbox().give(l.slot);
      fail("recv on rank ", host_.rank(), " from rank ", peer, " (tag ", tag,
           "): message has ", l.n, " elements, expected ", n,
           " (mismatched plan)");
    }
    MAPP_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), l.slot->ready, 0));
    if (n)
      copyConvert({l.slot->p, l.bf16}, out, n, be_.stream());
    MAPP_CUDA_CHECK(cudaEventRecord(l.slot->consumed, be_.stream()));
    mailbox().give(l.slot);
  }

private:
  int memberIndex(const CommGroup &g, const char *what) {
    int idx = g.indexOf(host_.rank());
    if (idx < 0)
      fail(what, " over ", g.str(), ": rank ", host_.rank(),
           " is not a member");
    if (g.size() > kMaxDeviceGroup)
      fail(what, " over ", g.str(), ": device collectives take at most ",
           kMaxDeviceGroup, " members (MAPP_CUDA_COMM=host stages larger "
           "groups through the host)");
    return idx;
  }

  Members membersOf(const std::vector<Published> &all) {
    Members ms{};
    ms.n = static_cast<int>(all.size());
    for (size_t i = 0; i < all.size(); ++i)
      ms.v[i] = {all[i].in, all[i].inBf16};
    return ms;
  }

  cudaEvent_t eventOf(const CommGroup &g, int k) {
    auto it = events_.find(g.members);
    if (it == events_.end()) {
      std::array<cudaEvent_t, 3> evs{};
      for (cudaEvent_t &e : evs)
        MAPP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      it = events_.emplace(g.members, evs).first;
    }
    return it->second[k];
  }

  /// One phase (see the file comment); returns every member's publication.
  std::vector<Published> phase(const CommGroup &g, int k, const char *what,
                               Published mine) {
    mine.ready = eventOf(g, k);
    MAPP_CUDA_CHECK(cudaEventRecord(mine.ready, be_.stream()));
    int m = g.size(), idx = g.indexOf(host_.rank());
    std::vector<Published> blocks(m, mine), all(m);
    host_.allToAll(blocks.data(), all.data(), sizeof(Published), g);
    for (int i = 0; i < m; ++i) {
      if (all[i].n != mine.n)
        fail(what, " over ", g.str(), ": rank ", host_.rank(), " has ",
             mine.n, " elements, rank ", g.members[i], " has ", all[i].n,
             " (mismatched plan)");
      if (i != idx)
        MAPP_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), all[i].ready, 0));
    }
    return all;
  }

  CudaBackend &be_;
  Communicator &host_;
  std::map<std::vector<int>, std::array<cudaEvent_t, 3>> events_;
};

} // namespace

std::unique_ptr<DeviceComm> cuda::createLocalDeviceComm(CudaBackend &be,
                                                        Communicator &host) {
  return std::make_unique<LocalDeviceComm>(be, host);
}

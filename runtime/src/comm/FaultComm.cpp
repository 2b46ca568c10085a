//===- FaultComm.cpp - injected slow links and slow ranks -----------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/Faults.h"

#include <algorithm>
#include <cmath>
#include <csignal>

#include <chrono>
#include <map>
#include <thread>

using namespace mapp::rt;

Injection mapp::rt::parseInjection(const std::string &spec) {
  Injection in;
  std::string why;
  if (!parseFaultSpec(spec, in, &why))
    fail("--inject '", spec, "': ", why);
  return in;
}

double mapp::rt::slowComputeFactor(const std::vector<Injection> &inj,
                                   int rank, int64_t step) {
  double f = 1;
  for (const Injection &i : inj)
    if (i.kind == Injection::SlowCompute && i.rank == rank && i.activeAt(step))
      f *= i.factor;
  return f;
}

void mapp::rt::stopIfInjected(const std::vector<Injection> &inj, int rank,
                              int64_t step) {
  for (const Injection &i : inj)
    if (i.kind == Injection::Stop && i.rank == rank && i.fromStep == step)
      raise(SIGSTOP);
}

void mapp::rt::crashIfInjected(const std::vector<Injection> &inj, int rank,
                               int64_t step, bool process) {
  for (const Injection &i : inj)
    if (i.kind == Injection::RankCrash && i.rank == rank &&
        i.fromStep == step) {
      if (process)
        raise(SIGKILL); // as the OOM killer or a lost node would: no cleanup
      throw RankCrashed(rank, step);
    }
}

namespace {

/// A receive over a faulty link: complete once the inner receive is and the
/// message's delivery time (computed from its send time) has passed.
struct FaultRecv : P2PRequest {
  P2PHandle inner;
  bool timed = false;
  uint64_t deliverNs = 0;
};

/// Forwards everything to the wrapped communicator; messages arriving over a
/// faulty link are held back until sentNs + the link's delay (+ the bytes'
/// serialization behind the previous message at the link's bandwidth).
class FaultComm final : public Communicator {
public:
  FaultComm(std::unique_ptr<Communicator> c, std::vector<Injection> links)
      : c_(std::move(c)), links_(std::move(links)) {
    timeoutS_ = c_->timeout();
  }
  std::string name() const override { return c_->name(); }
  int rank() const override { return c_->rank(); }
  int worldSize() const override { return c_->worldSize(); }
  void allReduce(float *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    c_->allReduce(b, n, op, g);
  }
  void allReduce(double *b, int64_t n, ReduceOp op,
                 const CommGroup &g) override {
    c_->allReduce(b, n, op, g);
  }
  void allGather(const float *in, float *out, int64_t n,
                 const CommGroup &g) override {
    c_->allGather(in, out, n, g);
  }
  void reduceScatter(const float *in, float *out, int64_t n, ReduceOp op,
                     const CommGroup &g) override {
    c_->reduceScatter(in, out, n, op, g);
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    c_->allToAll(in, out, bytes, g);
  }
  void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                 void *out, const std::vector<uint64_t> &recvBytes,
                 const CommGroup &g) override {
    c_->allToAllv(in, sendBytes, out, recvBytes, g);
  }
  void send(const void *buf, size_t bytes, int peer, int64_t tag) override {
    c_->send(buf, bytes, peer, tag);
  }
  P2PHandle isend(const void *buf, size_t bytes, int peer,
                  int64_t tag) override {
    return c_->isend(buf, bytes, peer, tag);
  }
  bool sharesClockWith(int peer) const override {
    return c_->sharesClockWith(peer);
  }
  void recv(void *buf, size_t bytes, int peer, int64_t tag) override {
    recvPosted(buf, bytes, peer, tag);
  }
  P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override {
    auto r = std::make_shared<FaultRecv>();
    r->isRecv = true;
    r->buf = buf;
    r->bytes = bytes;
    r->peer = peer;
    r->tag = tag;
    r->inner = c_->irecv(buf, bytes, peer, tag);
    return r;
  }
  bool test(P2PRequest &base) override {
    if (base.done.load())
      return true;
    auto *r = dynamic_cast<FaultRecv *>(&base);
    if (!r)
      return c_->test(base);
    if (!arrived(*r))
      return false;
    if (p2pNowNs() < r->deliverNs)
      return false;
    r->done = true;
    return true;
  }
  int waitAny(const std::vector<P2PRequest *> &reqs,
              uint64_t deadlineNs) override {
    for (;;) {
      std::vector<P2PRequest *> inner;
      std::vector<int> innerIdx;
      uint64_t next = deadlineNs; // earliest delivery of an arrived message
      for (size_t i = 0; i < reqs.size(); ++i) {
        if (test(*reqs[i]))
          return static_cast<int>(i);
        auto *r = dynamic_cast<FaultRecv *>(reqs[i]);
        if (r && r->timed) {
          next = next ? std::min(next, r->deliverNs) : r->deliverNs;
        } else {
          inner.push_back(r ? r->inner.get() : reqs[i]);
          innerIdx.push_back(static_cast<int>(i));
        }
      }
      if (deadlineNs && p2pNowNs() >= deadlineNs)
        return -1;
      if (inner.empty()) {
        uint64_t now = p2pNowNs();
        if (next > now)
          std::this_thread::sleep_for(std::chrono::nanoseconds(next - now));
        continue;
      }
      int k = c_->waitAny(inner, next);
      if (k >= 0 && !dynamic_cast<FaultRecv *>(reqs[innerIdx[k]]))
        return innerIdx[k];
    }
  }
  void cancel(P2PRequest &base) override {
    auto *r = dynamic_cast<FaultRecv *>(&base);
    c_->cancel(r ? *r->inner : base);
  }
  void setStep(int64_t step) override {
    step_ = step;
    c_->setStep(step);
  }
  void barrier() override { c_->barrier(); }
  void progress() override { c_->progress(); }
  void flush() override { c_->flush(); }
  bool sharesAddressSpace() const override { return c_->sharesAddressSpace(); }
  int ranksOnThisHost() const override { return c_->ranksOnThisHost(); }
  void *deviceImpl() const override { return c_->deviceImpl(); }
  int deviceOrdinal() const override { return c_->deviceOrdinal(); }

private:
  /// Once the inner receive completed: when the message is deliverable.
  bool arrived(FaultRecv &r) {
    if (r.timed)
      return true;
    c_->setTimeout(timeoutS_);
    if (!c_->test(*r.inner))
      return false;
    r.sentNs = r.inner->sentNs;
    r.completedNs = r.inner->completedNs;
    double delayS = 0, gbps = 0;
    for (const Injection &i : links_)
      if (i.src == r.peer && i.activeAt(step_)) {
        if (i.kind == Injection::LinkDelay)
          delayS += i.us * 1e-6;
        else
          gbps = gbps > 0 ? std::min(gbps, i.gbps) : i.gbps;
      }
    uint64_t heldUntil = 0; // the fault's release of the payload (0: none)
    if (gbps > 0) {
      // The wire is busy with earlier messages of this link first.
      uint64_t &free = linkFreeNs_[r.peer];
      uint64_t start = std::max(r.sentNs, free);
      free = start + static_cast<uint64_t>(static_cast<double>(r.bytes) * 8 /
                                           (gbps * 1e9) * 1e9);
      heldUntil = free;
    }
    if (delayS > 0)
      heldUntil = std::max(heldUntil,
                           r.sentNs + static_cast<uint64_t>(delayS * 1e9));
    uint64_t deliver = std::max({r.sentNs, r.completedNs, heldUntil});
    r.deliverNs = deliver;
    // The landing is the fault's release where that came after the inner
    // landing was noticed (exact); else it lies where the inner one does,
    // not before the release. No fault active: the inner bounds as they
    // are (an MPI receiver that noticed late proves no slow wire).
    r.pendingNs = std::max(r.inner->pendingNs, heldUntil);
    r.completedNs = deliver;
    r.timed = true;
    return true;
  }

  std::unique_ptr<Communicator> c_;
  std::vector<Injection> links_; // link faults whose dst is this rank
  std::map<int, uint64_t> linkFreeNs_;
  int64_t step_ = 0;
};

} // namespace

std::unique_ptr<Communicator>
mapp::rt::withLinkFaults(std::unique_ptr<Communicator> c,
                         const std::vector<Injection> &inj) {
  std::vector<Injection> links;
  for (const Injection &i : inj)
    if ((i.kind == Injection::LinkDelay || i.kind == Injection::LinkBandwidth) &&
        i.dst == c->rank())
      links.push_back(i);
  if (links.empty())
    return c;
  return std::make_unique<FaultComm>(std::move(c), std::move(links));
}

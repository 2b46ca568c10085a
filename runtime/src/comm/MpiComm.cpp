//===- MpiComm.cpp - one rank per MPI process ------------------------------===//
//
// Sub-communicators: tp, dp, pp and world are split from MPI_COMM_WORLD
// when the layout is set (every rank makes the same calls in the same
// order); groups given by explicit ranks are created on first use with
// MPI_Comm_create_group (collective over the members only).
//
// Every operation is nonblocking underneath and waited for by polling with
// the communicator's timeout, so a dead or mismatched peer is an Error, not
// a hang; the error handler is MPI_ERRORS_RETURN.
//
// Reductions are deterministic and equal to the local communicator's:
// all_reduce = all-to-all of chunks, each member sums its chunk over the
// members in member order in double, all-gather of the chunks.
// reduce_scatter = all-to-all of blocks + the same ordered sum.
//
// send copies the bytes into an owned buffer and posts MPI_Isend (buffered
// semantics, as the local communicator); completed sends are reaped on
// later calls and all are waited for by flush(). Every message carries an
// 8-byte trailer, the sender's steady-clock send time (P2PRequest.sentNs);
// irecv posts MPI_Irecv into a staging buffer of bytes + 8 and copies the
// payload into the caller's buffer when test() finds it complete.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <thread>

using namespace mapp::rt;

namespace {

using Clock = std::chrono::steady_clock;

std::string mpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

void check(int rc, const std::string &what) {
  if (rc != MPI_SUCCESS)
    fail(what, ": MPI error: ", mpiError(rc));
}

template <typename T> MPI_Datatype mpiType();
template <> MPI_Datatype mpiType<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpiType<double>() { return MPI_DOUBLE; }

class MpiComm final : public Communicator {
public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      // Every wait here is a test loop with its own back-off, and the
      // executor calls progress() between ops: Open MPI's sched_yield on an
      // idle progress call (on by default when oversubscribed) would give
      // the core away at each of those calls. A user's setting wins.
      setenv("OMPI_MCA_mpi_yield_when_idle", "0", 0);
      int provided;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided),
            "MPI_Init_thread");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    void *ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    tagUb_ = flag ? *static_cast<int *>(ub) : 32767;
    MPI_Comm host;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_,
                              MPI_INFO_NULL, &host),
          "MPI_Comm_split_type");
    MPI_Comm_size(host, &hostSize_);
    // The world ranks of this host share its steady clock (P2P stamps).
    MPI_Group hostGroup, worldGroup;
    MPI_Comm_group(host, &hostGroup);
    MPI_Comm_group(MPI_COMM_WORLD, &worldGroup);
    std::vector<int> local(hostSize_), world(hostSize_);
    for (int i = 0; i < hostSize_; ++i)
      local[i] = i;
    MPI_Group_translate_ranks(hostGroup, hostSize_, local.data(), worldGroup,
                              world.data());
    sameHost_.assign(size_, false);
    for (int r : world)
      if (r >= 0 && r < size_)
        sameHost_[r] = true;
    MPI_Group_free(&hostGroup);
    MPI_Group_free(&worldGroup);
    MPI_Comm_free(&host);
  }
  ~MpiComm() override {
    try {
      flush();
    } catch (...) {
    }
    for (auto &[k, c] : comms_)
      if (c != MPI_COMM_WORLD && c != MPI_COMM_NULL)
        MPI_Comm_free(&c);
  }
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int worldSize() const override { return size_; }
  int ranksOnThisHost() const override { return hostSize_; }
  bool sharesClockWith(int peer) const override {
    return peer >= 0 && peer < size_ && sameHost_[peer];
  }

  void allReduce(float *buf, int64_t count, ReduceOp op,
                 const CommGroup &g) override {
    allReduceT(buf, count, op, g);
  }
  void allReduce(double *buf, int64_t count, ReduceOp op,
                 const CommGroup &g) override {
    allReduceT(buf, count, op, g);
  }

  void allGather(const float *in, float *out, int64_t count,
                 const CommGroup &g) override {
    MPI_Comm c = commOf(g, "all_gather");
    MPI_Request r;
    check(MPI_Iallgather(in, asInt(count), MPI_FLOAT, out, asInt(count),
                         MPI_FLOAT, c, &r),
          "all_gather over " + g.str());
    waitFor(r, "all_gather over " + g.str());
  }

  void reduceScatter(const float *in, float *out, int64_t count, ReduceOp op,
                     const CommGroup &g) override {
    MPI_Comm c = commOf(g, "reduce_scatter");
    int n = g.size();
    std::vector<float> blocks(static_cast<size_t>(count) * n);
    MPI_Request r;
    check(MPI_Ialltoall(in, asInt(count), MPI_FLOAT, blocks.data(),
                        asInt(count), MPI_FLOAT, c, &r),
          "reduce_scatter over " + g.str());
    waitFor(r, "reduce_scatter over " + g.str());
    reduceBlocks(blocks.data(), out, count, n, op);
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    MPI_Comm c = commOf(g, "all_to_all");
    MPI_Request r;
    check(MPI_Ialltoall(in, asInt(bytes), MPI_BYTE, out, asInt(bytes),
                        MPI_BYTE, c, &r),
          "all_to_all over " + g.str());
    waitFor(r, "all_to_all over " + g.str());
  }

  // Counts agreed on every member first (agreeCounts), so MPI never sees a
  // receive shorter than its message.
  void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                 void *out, const std::vector<uint64_t> &recvBytes,
                 const CommGroup &g) override {
    agreeCounts(sendBytes, recvBytes, g);
    int n = g.size();
    if (n == 1) {
      if (in != out && sendBytes[0])
        std::memmove(out, in, sendBytes[0]);
      return;
    }
    MPI_Comm c = commOf(g, "all_to_allv");
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int64_t so = 0, ro = 0;
    for (int i = 0; i < n; ++i) {
      sc[i] = asInt(static_cast<int64_t>(sendBytes[i]));
      sd[i] = asInt(so);
      so += static_cast<int64_t>(sendBytes[i]);
      rc[i] = asInt(static_cast<int64_t>(recvBytes[i]));
      rd[i] = asInt(ro);
      ro += static_cast<int64_t>(recvBytes[i]);
    }
    std::string what = "all_to_allv over " + g.str();
    MPI_Request r;
    check(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(),
                         rd.data(), MPI_BYTE, c, &r),
          what);
    waitFor(r, what);
  }

  void send(const void *buf, size_t bytes, int peer, int64_t tag) override {
    std::string what = "send from rank " + std::to_string(rank_) +
                       " to rank " + std::to_string(peer) + " (tag " +
                       std::to_string(tag) + ")";
    checkPeer(peer, tag, what);
    reap();
    pending_.emplace_back();
    Pending &p = pending_.back();
    p.what = what;
    p.data.resize(bytes + sizeof(uint64_t));
    if (bytes)
      std::memcpy(p.data.data(), buf, bytes);
    uint64_t now = p2pNowNs();
    std::memcpy(p.data.data() + bytes, &now, sizeof now);
    check(MPI_Isend(p.data.data(), asInt(p.data.size()), MPI_BYTE, peer,
                    static_cast<int>(tag), MPI_COMM_WORLD, &p.req),
          what);
  }

  void recv(void *buf, size_t bytes, int peer, int64_t tag) override {
    recvPosted(buf, bytes, peer, tag);
  }

  P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override {
    auto r = std::make_shared<MpiRecv>();
    r->what = "recv on rank " + std::to_string(rank_) + " from rank " +
              std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
    checkPeer(peer, tag, r->what);
    reap();
    r->isRecv = true;
    r->buf = buf;
    r->bytes = bytes;
    r->peer = peer;
    r->tag = tag;
    r->staging.resize(bytes + sizeof(uint64_t));
    check(MPI_Irecv(r->staging.data(), asInt(r->staging.size()), MPI_BYTE,
                    peer, static_cast<int>(tag), MPI_COMM_WORLD, &r->req),
          r->what);
    return r;
  }

  bool test(P2PRequest &base) override {
    if (base.done.load())
      return true;
    auto *r = dynamic_cast<MpiRecv *>(&base);
    if (!r)
      return Communicator::test(base);
    int done = 0;
    MPI_Status st;
    int rc = MPI_Test(&r->req, &done, &st);
    if (rc != MPI_SUCCESS)
      fail(r->what, ": MPI error: ", mpiError(rc));
    if (!done) {
      r->pendingNs = p2pNowNs(); // the landing is later than this
      return false;
    }
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (static_cast<size_t>(got) != r->staging.size())
      fail(r->what, ": message has ",
           got - static_cast<int>(sizeof(uint64_t)), " bytes, expected ",
           r->bytes, " (mismatched plan)");
    if (r->bytes)
      std::memcpy(r->buf, r->staging.data(), r->bytes);
    std::memcpy(&r->sentNs, r->staging.data() + r->bytes, sizeof(uint64_t));
    r->completedNs = p2pNowNs();
    r->done = true;
    return true;
  }

  int waitAny(const std::vector<P2PRequest *> &reqs,
              uint64_t deadlineNs) override {
    auto start = Clock::now();
    int spins = 0;
    for (;;) {
      for (size_t i = 0; i < reqs.size(); ++i)
        if (test(*reqs[i]))
          return static_cast<int>(i);
      if (deadlineNs && p2pNowNs() >= deadlineNs)
        return -1;
      // Backed off: MPI has no blocking wait on several requests with a
      // timeout; 200 us sleeps keep a waiting rank off the cores.
      if (++spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(
            std::chrono::microseconds(spins < 1000 ? 20 : 200));
      double waited =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (timeoutS_ > 0 && waited > timeoutS_) {
        auto *r = reqs.empty() ? nullptr : dynamic_cast<MpiRecv *>(reqs[0]);
        fail(r ? r->what : std::string("waitAny"), " (rank ", rank_,
             "): timed out after ", timeoutS_,
             " s (a peer is dead or the ranks' plans disagree)");
      }
    }
  }

  void cancel(P2PRequest &base) override {
    auto *r = dynamic_cast<MpiRecv *>(&base);
    if (!r || r->done.load() || r->req == MPI_REQUEST_NULL)
      return;
    MPI_Cancel(&r->req);
    MPI_Request_free(&r->req);
  }

  void barrier() override {
    MPI_Request r;
    check(MPI_Ibarrier(MPI_COMM_WORLD, &r), "barrier");
    waitFor(r, "barrier over world");
  }

  void progress() override {
    // Throttled: ops can be a few microseconds; one MPI call costs about one.
    uint64_t now = p2pNowNs();
    if (now - lastProgressNs_ < kProgressIntervalNs)
      return;
    lastProgressNs_ = now;
    if (!pending_.empty()) {
      reap(); // testing a send runs MPI's progress engine for everything
      return;
    }
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
               MPI_STATUS_IGNORE);
  }

  void flush() override {
    for (Pending &p : pending_)
      waitFor(p.req, p.what + " (delivery)");
    pending_.clear();
  }

private:
  static constexpr uint64_t kProgressIntervalNs = 20000;
  uint64_t lastProgressNs_ = 0;

  struct MpiRecv : P2PRequest {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<uint8_t> staging; // payload + the sender's time stamp
    std::string what;
  };
  struct Pending {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<uint8_t> data;
    std::string what;
  };

  static int asInt(int64_t n) {
    if (n < 0 || n > INT32_MAX)
      fail("MPI message of ", n, " elements exceeds the int count limit");
    return static_cast<int>(n);
  }

  void checkPeer(int peer, int64_t tag, const std::string &what) {
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail(what, ": no such peer in a world of ", size_);
    if (tag < 0 || tag > tagUb_)
      fail(what, ": tag outside MPI's range [0, ", tagUb_, "]");
  }

  void reap() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Status st;
      check(MPI_Test(&it->req, &done, &st), it->what);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  /// Polls `r` until complete; Error after the timeout.
  void waitFor(MPI_Request &r, const std::string &what,
               MPI_Status *status = nullptr) {
    auto start = Clock::now();
    MPI_Status st;
    int spins = 0;
    for (;;) {
      int done = 0;
      int rc = MPI_Test(&r, &done, &st);
      if (rc != MPI_SUCCESS)
        fail(what, " (rank ", rank_, "): MPI error: ", mpiError(rc));
      if (done) {
        if (status)
          *status = st;
        return;
      }
      if (++spins < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(
            spins < 1000 ? 20 : 200));
      double waited =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (timeoutS_ > 0 && waited > timeoutS_)
        fail(what, " (rank ", rank_, "): timed out after ", timeoutS_,
             " s (a peer is dead or the ranks' plans disagree)");
    }
  }

  MPI_Comm commOf(const CommGroup &g, const char *what) {
    if (g.indexOf(rank_) < 0)
      fail(what, " over ", g.str(), ": rank ", rank_, " is not a member");
    for (int m : g.members)
      if (m < 0 || m >= size_)
        fail(what, " over ", g.str(), ": rank ", m, " is outside the world of ",
             size_);
    auto it = comms_.find(g.members);
    if (it != comms_.end())
      return it->second;
    if (g.size() == size_) {
      comms_[g.members] = MPI_COMM_WORLD;
      return MPI_COMM_WORLD;
    }
    MPI_Group world, sub;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, g.size(), g.members.data(), &sub);
    // A tag per member set keeps concurrent creations apart.
    uint32_t h = 2166136261u;
    for (int m : g.members)
      h = (h ^ static_cast<uint32_t>(m)) * 16777619u;
    MPI_Comm c = MPI_COMM_NULL;
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, sub,
                                   static_cast<int>(h % 30000), &c);
    MPI_Group_free(&sub);
    MPI_Group_free(&world);
    check(rc, std::string("creating the communicator of ") + g.str());
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    comms_[g.members] = c;
    return c;
  }

  template <typename T>
  static void reduceBlocks(const T *blocks, T *out, int64_t count, int n,
                           ReduceOp op) {
    for (int64_t e = 0; e < count; ++e) {
      double acc = blocks[e];
      for (int i = 1; i < n; ++i) {
        double v = blocks[i * count + e];
        acc = op == ReduceOp::Max ? std::max(acc, v) : acc + v;
      }
      if (op == ReduceOp::Avg)
        acc /= n;
      out[e] = static_cast<T>(acc);
    }
  }

  template <typename T>
  void allReduceT(T *buf, int64_t count, ReduceOp op, const CommGroup &g) {
    int n = g.size();
    if (n == 1)
      return;
    std::string what = "all_reduce over " + g.str();
    MPI_Comm c = commOf(g, "all_reduce");
    int idx = g.indexOf(rank_);
    std::vector<int> cnt(n), displ(n), rcnt(n), rdispl(n);
    for (int i = 0; i < n; ++i) {
      int64_t lo = count * i / n, hi = count * (i + 1) / n;
      cnt[i] = asInt(hi - lo);
      displ[i] = asInt(lo);
    }
    int64_t myCount = cnt[idx];
    for (int i = 0; i < n; ++i) {
      rcnt[i] = asInt(myCount);
      rdispl[i] = asInt(myCount * i);
    }
    std::vector<T> blocks(std::max<int64_t>(1, myCount * n)), chunk(
                                                                  std::max<int64_t>(
                                                                      1, myCount));
    MPI_Request r;
    check(MPI_Ialltoallv(buf, cnt.data(), displ.data(), mpiType<T>(),
                         blocks.data(), rcnt.data(), rdispl.data(),
                         mpiType<T>(), c, &r),
          what);
    waitFor(r, what);
    reduceBlocks(blocks.data(), chunk.data(), myCount, n, op);
    check(MPI_Iallgatherv(chunk.data(), asInt(myCount), mpiType<T>(), buf,
                          cnt.data(), displ.data(), mpiType<T>(), c, &r),
          what);
    waitFor(r, what);
  }

  int rank_ = 0, size_ = 1, tagUb_ = 32767, hostSize_ = 1;
  std::vector<bool> sameHost_; // world rank -> on this host
  std::map<std::vector<int>, MPI_Comm> comms_;
  std::list<Pending> pending_;
};

} // namespace

bool mapp::rt::haveMpiComm() { return true; }

std::unique_ptr<Communicator> mapp::rt::createMpiComm() {
  return std::make_unique<MpiComm>();
}

void mapp::rt::mpiAbort(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized)
    MPI_Abort(MPI_COMM_WORLD, code);
}

void mapp::rt::mpiFinalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized)
    MPI_Finalize();
}

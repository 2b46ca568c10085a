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
// Naming the ranks a timed-out wait waits for: MpiWitness.h.
//
//===----------------------------------------------------------------------===//
#include "MpiWitness.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Rendezvous.h"
#include "mapp/rt/Error.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

using namespace mapp::rt;

namespace {

using namespace mapp::rt::mpi;


/// MPI_Init once per process (the communicator and the NCCL rendezvous).
void initMpi() {
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
}

class MpiComm final : public Communicator {
public:
  MpiComm() {
    initMpi();
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
    w_ = std::make_shared<Witness>();
    theWitness() = w_;
    for (int r = 0; r < size_; ++r)
      world_.push_back(r);
  }
  ~MpiComm() override {
    // Unwinding from an error (a peer that timed out, say): the job is
    // about to be aborted, and waiting for undelivered sends would only
    // delay that by another timeout.
    if (!std::uncaught_exceptions() && w_->failed.empty()) {
      try {
        flush();
      } catch (...) {
      }
    }
    for (auto &[k, c] : comms_)
      if (c.comm != MPI_COMM_WORLD && c.comm != MPI_COMM_NULL)
        MPI_Comm_free(&c.comm);
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
    GroupComm &c = commOf(g, "all_gather");
    MPI_Request r;
    check(MPI_Iallgather(in, asInt(count), MPI_FLOAT, out, asInt(count),
                         MPI_FLOAT, c.comm, &r),
          "all_gather over " + g.str());
    waitFor(r, "all_gather over " + g.str(), c.posted());
  }

  void reduceScatter(const float *in, float *out, int64_t count, ReduceOp op,
                     const CommGroup &g) override {
    GroupComm &c = commOf(g, "reduce_scatter");
    int n = g.size();
    std::vector<float> blocks(static_cast<size_t>(count) * n);
    MPI_Request r;
    check(MPI_Ialltoall(in, asInt(count), MPI_FLOAT, blocks.data(),
                        asInt(count), MPI_FLOAT, c.comm, &r),
          "reduce_scatter over " + g.str());
    waitFor(r, "reduce_scatter over " + g.str(), c.posted());
    reduceBlocks(blocks.data(), out, count, n, op);
  }

  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override {
    GroupComm &c = commOf(g, "all_to_all");
    MPI_Request r;
    check(MPI_Ialltoall(in, asInt(bytes), MPI_BYTE, out, asInt(bytes),
                        MPI_BYTE, c.comm, &r),
          "all_to_all over " + g.str());
    waitFor(r, "all_to_all over " + g.str(), c.posted());
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
    GroupComm &c = commOf(g, "all_to_allv");
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
                         rd.data(), MPI_BYTE, c.comm, &r),
          what);
    waitFor(r, what, c.posted());
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
    p.peer = peer;
    p.tag = tag;
    p.data.resize(bytes + sizeof(uint64_t));
    if (bytes)
      std::memcpy(p.data.data(), buf, bytes);
    uint64_t now = p2pNowNs();
    std::memcpy(p.data.data() + bytes, &now, sizeof now);
    check(MPI_Isend(p.data.data(), asInt(p.data.size()), MPI_BYTE, peer,
                    static_cast<int>(tag), MPI_COMM_WORLD, &p.req),
          what);
    ++w_->sent[{peer, tag}];
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
    ++w_->received[{r->peer, r->tag}];
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
    auto *first = reqs.empty() ? nullptr : dynamic_cast<MpiRecv *>(reqs[0]);
    static const std::string kWaitAny = "waitAny";
    WaitMark waiting(*w_, first ? first->what : kWaitAny, start);
    int spins = 0;
    for (;;) {
      for (size_t i = 0; i < reqs.size(); ++i)
        if (test(*reqs[i]))
          return static_cast<int>(i);
      if (deadlineNs && p2pNowNs() >= deadlineNs)
        return -1;
      // Backed off: MPI has no blocking wait on several requests with a
      // timeout; 200 us sleeps keep a waiting rank off the cores.
      if (++spins < 64) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(spins < 1000 ? 20 : 200));
      w_->serveEvery(kServeWaitingNs);
      double waited =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (timeoutS_ > 0 && waited > timeoutS_)
        recvTimedOut(reqs);
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
    CommGroup world{"world", world_};
    GroupComm &c = commOf(world, "barrier");
    MPI_Request r;
    check(MPI_Ibarrier(c.comm, &r), "barrier");
    waitFor(r, "barrier over world", c.posted());
  }

  void progress() override {
    // Throttled: ops can be a few microseconds; one MPI call costs about one.
    uint64_t now = p2pNowNs();
    if (now - lastProgressNs_ < kProgressIntervalNs)
      return;
    lastProgressNs_ = now;
    w_->serveEvery(kServeComputingNs, now);
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
      waitFor(p.req, p.what + " (delivery)",
              Awaited{nullptr, 0, p.peer, p.tag});
    pending_.clear();
  }

private:
  static constexpr uint64_t kProgressIntervalNs = 20000;
  // How often a rank looks for questions: while it waits, and between ops.
  static constexpr uint64_t kServeWaitingNs = 2000000;
  static constexpr uint64_t kServeComputingNs = 10000000;
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
    int peer = -1;
    int64_t tag = 0;
  };
  /// A group's communicator and the number of collectives posted on it
  /// (the witness's counter, which outlives this communicator).
  struct GroupComm {
    MPI_Comm comm = MPI_COMM_NULL;
    const std::vector<int> *members = nullptr;
    uint64_t *entered = nullptr;
    /// Counts one more collective posted; what a wait for it waits for.
    Awaited posted() { return {members, ++*entered, -1, 0}; }
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

  /// How long a timed-out wait listens for the answers of the ranks it
  /// waits for (a live rank answers within milliseconds).
  double graceS() const { return std::min(2.0, timeoutS_ / 4); }

  /// Records the timeout (the witness answers "has failed" from now on)
  /// and throws `what (rank R): timed out after T s` + `why`.
  [[noreturn]] void timedOut(const std::string &what, const std::string &why) {
    w_->failed = what;
    w_->failedGraceS = graceS();
    fail(what, " (rank ", rank_, "): timed out after ", timeoutS_, " s", why);
  }

  static std::string silentClause(const std::vector<int> &silent, double g) {
    return std::string(silent.size() == 1 ? "rank " : "ranks ") +
           rankList(silent) + " did not answer within " + seconds(g) +
           " s: stopped, hung or dead";
  }

  /// A collective timed out: asks the other members how many collectives
  /// of the group they posted. The ranks it waits for are those that did
  /// not reach it and did not answer (stopped, hung or dead) or are in no
  /// communication call; members that did not reach it because they wait
  /// themselves (for the same culprit, usually: an MPI collective can
  /// complete on some members before others) are named after them. Only
  /// when every absent member waits are they the ranks it waits for.
  [[noreturn]] void collectiveTimedOut(const std::string &what,
                                       const Awaited &a) {
    std::vector<int> others;
    for (int m : *a.members)
      if (m != rank_)
        others.push_back(m);
    double g = graceS();
    std::map<int, Answer> got = w_->ask(others, *a.members, {}, g);
    std::vector<int> culprits, silent, heldUp;
    std::vector<std::string> busy, held;
    for (int m : others) {
      auto it = got.find(m);
      std::string r = "rank " + std::to_string(m) + " ";
      if (it == got.end()) {
        culprits.push_back(m);
        silent.push_back(m);
      } else if (it->second.entered >= a.seq) {
        continue; // here (or past it)
      } else if (it->second.state == Answer::Computing) {
        culprits.push_back(m);
        busy.push_back(r + it->second.activity);
      } else {
        heldUp.push_back(m);
        uint64_t behind = a.seq - it->second.entered;
        held.push_back(r + "is " + std::to_string(behind) + " collective" +
                       (behind == 1 ? "" : "s") + " of this group behind and " +
                       it->second.activity);
      }
    }
    if (culprits.empty() && heldUp.empty())
      timedOut(what, " with every member inside it (they all answered: MPI "
                     "made no progress, or the ranks' plans disagree on its "
                     "sizes)");
    if (culprits.empty()) {
      culprits.swap(heldUp);
      busy.swap(held);
    }
    std::string why = silent.empty() ? "" : silentClause(silent, g);
    for (const std::string &s : busy)
      why += (why.empty() ? "" : "; ") + s;
    std::string also;
    if (!heldUp.empty()) {
      also = "; rank(s) " + rankList(heldUp) +
             " did not get here either, held up themselves: ";
      for (size_t i = 0; i < held.size(); ++i)
        also += (i ? "; " : "") + held[i];
    }
    timedOut(what, " waiting for rank(s) " + rankList(culprits) + " (" + why +
                       ")" + also);
  }

  /// A receive (or several, waitAny) timed out: asks each sender whether
  /// it sent the message. Not answering: stopped, hung or dead; answering
  /// without having sent it: the rank the receive waits for (and where it
  /// is); having sent it: the message is incomplete here.
  [[noreturn]] void recvTimedOut(const std::vector<P2PRequest *> &reqs) {
    auto *first = reqs.empty() ? nullptr : dynamic_cast<MpiRecv *>(reqs[0]);
    std::string what = first ? first->what : std::string("waitAny");
    if (reqs.size() > 1)
      what += " and " + std::to_string(reqs.size() - 1) + " other receive(s)";
    std::vector<int> peers;
    std::map<int, std::vector<int64_t>> tags;
    for (P2PRequest *r : reqs) {
      if (!tags.count(r->peer))
        peers.push_back(r->peer);
      auto &t = tags[r->peer];
      if (std::find(t.begin(), t.end(), r->tag) == t.end())
        t.push_back(r->tag);
    }
    double g = graceS();
    std::vector<std::vector<int64_t>> asked;
    for (int p : peers)
      asked.push_back(tags[p]);
    std::map<int, Answer> got = w_->ask(peers, {}, asked, g);
    std::vector<int> waitingFor, silent;
    std::vector<std::string> clauses;
    for (int p : peers) {
      auto it = got.find(p);
      if (it == got.end()) {
        waitingFor.push_back(p);
        silent.push_back(p);
        continue;
      }
      const std::vector<int64_t> &t = tags[p];
      std::vector<int64_t> unsent;
      for (size_t i = 0; i < t.size(); ++i) {
        auto r = w_->received.find({p, t[i]});
        uint64_t mine = r == w_->received.end() ? 0 : r->second;
        if (it->second.sent[i] <= mine)
          unsent.push_back(t[i]);
      }
      std::string p_ = "rank " + std::to_string(p);
      if (!unsent.empty()) {
        waitingFor.push_back(p);
        std::string which = reqs.size() == 1 ? "it" : "tag(s) ";
        if (reqs.size() > 1)
          for (size_t i = 0; i < unsent.size(); ++i)
            which += (i ? "," : "") + std::to_string(unsent[i]);
        clauses.push_back(p_ + " has not sent " + which + "; " + p_ + " " +
                          it->second.activity);
      } else {
        clauses.push_back("the message from " + p_ +
                          " is incomplete here: " + p_ + " has sent it; " +
                          p_ + " " + it->second.activity);
      }
    }
    std::string why = silent.empty() ? "" : silentClause(silent, g);
    for (const std::string &c : clauses)
      why += (why.empty() ? "" : "; ") + c;
    if (waitingFor.empty())
      timedOut(what, ": " + why);
    timedOut(what, " waiting for rank(s) " + rankList(waitingFor) + " (" +
                       why + ")");
  }

  /// A send's delivery timed out: asks the receiver where it is.
  [[noreturn]] void deliveryTimedOut(const std::string &what,
                                     const Awaited &a) {
    double g = graceS();
    std::map<int, Answer> got = w_->ask({a.peer}, {}, {{a.tag}}, g);
    auto it = got.find(a.peer);
    std::string p_ = "rank " + std::to_string(a.peer);
    timedOut(what, " waiting for rank(s) " + std::to_string(a.peer) + " (" +
                       (it == got.end()
                            ? silentClause({a.peer}, g)
                            : p_ + " has not taken it; " + p_ + " " +
                                  it->second.activity) +
                       ")");
  }

  /// Polls `r` until complete; Error after the timeout, naming the ranks
  /// `a` waits for.
  void waitFor(MPI_Request &r, const std::string &what, const Awaited &a) {
    auto start = Clock::now();
    WaitMark waiting(*w_, what, start);
    int spins = 0;
    for (;;) {
      int done = 0;
      int rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        fail(what, " (rank ", rank_, "): MPI error: ", mpiError(rc));
      if (done)
        return;
      if (++spins < 64) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(
          std::chrono::microseconds(spins < 1000 ? 20 : 200));
      w_->serveEvery(kServeWaitingNs);
      double waited =
          std::chrono::duration<double>(Clock::now() - start).count();
      if (timeoutS_ > 0 && waited > timeoutS_) {
        if (a.members)
          collectiveTimedOut(what, a);
        deliveryTimedOut(what, a);
      }
    }
  }

  GroupComm &commOf(const CommGroup &g, const char *what) {
    if (g.indexOf(rank_) < 0)
      fail(what, " over ", g.str(), ": rank ", rank_, " is not a member");
    for (int m : g.members)
      if (m < 0 || m >= size_)
        fail(what, " over ", g.str(), ": rank ", m, " is outside the world of ",
             size_);
    auto it = comms_.find(g.members);
    if (it != comms_.end())
      return it->second;
    GroupComm gc;
    auto counter = w_->entered.emplace(g.members, 0).first;
    gc.members = &counter->first;
    gc.entered = &counter->second;
    if (g.size() == size_) {
      gc.comm = MPI_COMM_WORLD;
      return comms_[g.members] = gc;
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
    gc.comm = c;
    return comms_[g.members] = gc;
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
    GroupComm &c = commOf(g, "all_reduce");
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
                         mpiType<T>(), c.comm, &r),
          what);
    waitFor(r, what, c.posted());
    reduceBlocks(blocks.data(), chunk.data(), myCount, n, op);
    check(MPI_Iallgatherv(chunk.data(), asInt(myCount), mpiType<T>(), buf,
                          cnt.data(), displ.data(), mpiType<T>(), c.comm, &r),
          what);
    waitFor(r, what, c.posted());
  }

  int rank_ = 0, size_ = 1, tagUb_ = 32767, hostSize_ = 1;
  std::vector<bool> sameHost_; // world rank -> on this host
  std::shared_ptr<Witness> w_;
  std::vector<int> world_;
  std::map<std::vector<int>, GroupComm> comms_;
  std::list<Pending> pending_;
};

} // namespace

bool mapp::rt::haveMpiComm() { return true; }

std::unique_ptr<Communicator> mapp::rt::createMpiComm() {
  return std::make_unique<MpiComm>();
}

Blob mapp::rt::rendezvousMpi(int rank, int world, const Blob &blob,
                             double timeoutS) {
  initMpi();
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int mpiRank = 0, mpiWorld = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpiRank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpiWorld);
  if (mpiRank != rank || mpiWorld != world)
    fail("rendezvous: MPI says rank ", mpiRank, " of ", mpiWorld,
         ", the launcher's variables rank ", rank, " of ", world);
  // Length, then bytes; test loops so a rank that never comes is a timeout.
  Blob out = blob;
  uint64_t length = blob.size();
  auto waitFor = [&](MPI_Request &req, const char *what) {
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(timeoutS));
    int done = 0;
    while (true) {
      mpi::check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done)
        return;
      if (std::chrono::steady_clock::now() > deadline)
        fail("rendezvous over MPI: rank ", rank, " waited ",
             static_cast<int>(timeoutS), " s for rank 0's id (", what, ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  MPI_Request req;
  mpi::check(MPI_Ibcast(&length, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &req),
        "MPI_Ibcast");
  waitFor(req, "MPI_Ibcast of the length");
  out.resize(length);
  mpi::check(MPI_Ibcast(out.data(), static_cast<int>(length), MPI_BYTE, 0,
                   MPI_COMM_WORLD, &req),
        "MPI_Ibcast");
  waitFor(req, "MPI_Ibcast of the id");
  return out;
}

void mapp::rt::mpiAbort(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return;
  // A rank whose wait timed out answers its peers' questions a little
  // longer: they are likely timing out too, and name it alive, not dead.
  if (std::shared_ptr<Witness> w = theWitness(); w && !w->failed.empty())
    w->linger();
  MPI_Abort(MPI_COMM_WORLD, code);
}

void mapp::rt::mpiFinalize() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    theWitness().reset();
    MPI_Finalize();
  }
}

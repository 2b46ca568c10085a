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
// Naming the ranks a timed-out wait waits for. A pending MPI request cannot
// say which member is missing, so each rank keeps a few counters (the
// collectives it posted per group, the messages it sent and received per
// peer and tag) and answers questions about them on a duplicate of
// MPI_COMM_WORLD: a wait that times out asks the members it waits for
// ("where are you; how many collectives of this group did you post; how
// many messages of this tag did you send me?") and listens for a grace
// period, min(2 s, timeout / 4). Ranks answer whenever they are in a
// communication wait (every 2 ms of waiting) or between ops (progress(),
// every 10 ms), so a live rank answers within milliseconds; a stopped, hung
// or dead process cannot, and is named as such. Nothing is sent unless a
// wait times out: the normal path costs a counter update per operation and
// a clock comparison per progress() call. A rank that failed this way keeps
// answering ("has failed: ...") for one more grace period before
// MPI_Abort ends the job, so ranks that time out just after it still get
// their answers and report too.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
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

std::string seconds(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 3);
  os << s;
  return os.str();
}

std::string rankList(const std::vector<int> &ranks) {
  std::string s;
  for (int r : ranks)
    s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

/// What another rank said about itself (file comment, "Naming the ranks").
struct Answer {
  /// Where it is: in no communication call, waiting in one, or failed
  /// (its wait timed out).
  enum State { Computing, Waiting, Failed } state = Computing;
  uint64_t entered = 0; ///< collectives it posted on the asked group
  /// Per asked tag: messages it sent to / completed from the asker.
  std::vector<uint64_t> sent, received;
  std::string activity; ///< "is waiting in ...", "has failed: ...", ...
};

/// This process's answers and questions about who is where. One per
/// process (the communicator's counters must outlive it: mpiAbort answers
/// for one more grace period after the communicator is gone).
class Witness {
public:
  Witness() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &side_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  }
  ~Witness() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      return;
    for (Owned &o : sends_) {
      int done = 0;
      MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
      if (!done) {
        // A question to a rank that never took it: withdrawn; its buffer
        // is left to the process, which is about to end.
        MPI_Cancel(&o.req);
        MPI_Request_free(&o.req);
        new std::vector<uint8_t>(std::move(o.data));
      }
    }
    MPI_Comm_free(&side_);
  }

  // --- counters, updated by the communicator ---
  std::map<std::vector<int>, uint64_t> entered; ///< per member set
  std::map<std::pair<int, int64_t>, uint64_t> sent, received; ///< per peer, tag

  /// The wait this rank is in (null: none) and since when.
  const std::string *waitingIn = nullptr;
  uint64_t waitingSinceNs = 0;
  /// Set once a wait of this rank timed out: that wait, and the grace
  /// period it listened for answers.
  std::string failed;
  double failedGraceS = 0;

  /// Answers the questions that have come, at most every `intervalNs`
  /// (`now`: p2pNowNs()).
  void serveEvery(uint64_t intervalNs, uint64_t now = p2pNowNs()) {
    if (now - lastServeNs_ >= intervalNs)
      serve(now);
  }

  /// Asks `peers` about the member set `members` (a collective) or about
  /// the messages of tags[i] that peers[i] sent this rank (tags empty: no
  /// such question); returns the answers that came within `graceS`
  /// seconds, answering others' questions meanwhile.
  std::map<int, Answer> ask(const std::vector<int> &peers,
                            const std::vector<int> &members,
                            const std::vector<std::vector<int64_t>> &tags,
                            double graceS) {
    uint64_t id = nextQuestion_++;
    static const std::vector<int64_t> kNoTags;
    for (size_t i = 0; i < peers.size(); ++i) {
      const std::vector<int64_t> &t = tags.empty() ? kNoTags : tags[i];
      std::vector<int64_t> q{static_cast<int64_t>(id),
                             static_cast<int64_t>(t.size())};
      q.insert(q.end(), t.begin(), t.end());
      q.push_back(static_cast<int64_t>(members.size()));
      q.insert(q.end(), members.begin(), members.end());
      post(peers[i], kQuestionTag, q, "");
    }
    std::map<int, Answer> got;
    uint64_t deadline = p2pNowNs() + static_cast<uint64_t>(graceS * 1e9);
    while (got.size() < peers.size() && p2pNowNs() < deadline) {
      serve(p2pNowNs());
      for (;;) {
        MPI_Status st;
        std::vector<uint8_t> msg;
        if (!take(kAnswerTag, msg, st))
          break;
        std::vector<int64_t> w;
        std::string text;
        auto who = std::find(peers.begin(), peers.end(), st.MPI_SOURCE);
        if (!decode(msg, w, text) || w.size() < 4 ||
            static_cast<uint64_t>(w[0]) != id || who == peers.end())
          continue; // a late answer to an earlier question
        size_t n = static_cast<size_t>(w[1]);
        size_t asked = tags.empty() ? 0 : tags[who - peers.begin()].size();
        if (n != asked || w.size() != 4 + 2 * n || w[3] < Answer::Computing ||
            w[3] > Answer::Failed)
          continue;
        Answer a;
        a.entered = static_cast<uint64_t>(w[2]);
        a.state = static_cast<Answer::State>(w[3]);
        for (size_t i = 0; i < n; ++i) {
          a.sent.push_back(static_cast<uint64_t>(w[4 + 2 * i]));
          a.received.push_back(static_cast<uint64_t>(w[5 + 2 * i]));
        }
        a.activity = std::move(text);
        got[st.MPI_SOURCE] = std::move(a);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return got;
  }

  /// After a timeout: keeps answering (as failed) for the grace period, so
  /// the ranks that time out just after this one learn where it is.
  void linger() {
    uint64_t end = p2pNowNs() + static_cast<uint64_t>(failedGraceS * 1e9);
    while (p2pNowNs() < end) {
      serve(p2pNowNs());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

private:
  static constexpr int kQuestionTag = 1, kAnswerTag = 2;
  struct Owned {
    MPI_Request req = MPI_REQUEST_NULL;
    std::vector<uint8_t> data;
  };

  /// One message: int64 words, then text.
  static std::vector<uint8_t> encode(const std::vector<int64_t> &w,
                                     const std::string &text) {
    std::vector<uint8_t> b(8 + w.size() * 8 + text.size());
    uint64_t n = w.size();
    std::memcpy(b.data(), &n, 8);
    if (!w.empty())
      std::memcpy(b.data() + 8, w.data(), w.size() * 8);
    if (!text.empty())
      std::memcpy(b.data() + 8 + w.size() * 8, text.data(), text.size());
    return b;
  }
  static bool decode(const std::vector<uint8_t> &b, std::vector<int64_t> &w,
                     std::string &text) {
    uint64_t n = 0;
    if (b.size() < 8)
      return false;
    std::memcpy(&n, b.data(), 8);
    if (n > (b.size() - 8) / 8)
      return false;
    w.resize(n);
    if (n)
      std::memcpy(w.data(), b.data() + 8, n * 8);
    text.assign(reinterpret_cast<const char *>(b.data()) + 8 + n * 8,
                b.size() - 8 - n * 8);
    return true;
  }

  void post(int peer, int tag, const std::vector<int64_t> &w,
            const std::string &text) {
    sends_.push_back({MPI_REQUEST_NULL, encode(w, text)});
    Owned &o = sends_.back();
    if (MPI_Isend(o.data.data(), static_cast<int>(o.data.size()), MPI_BYTE,
                  peer, tag, side_, &o.req) != MPI_SUCCESS)
      sends_.pop_back();
  }

  bool take(int tag, std::vector<uint8_t> &msg, MPI_Status &st) {
    int flag = 0;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, side_, &flag, &st) != MPI_SUCCESS ||
        !flag)
      return false;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    msg.resize(static_cast<size_t>(std::max(n, 0)));
    return MPI_Recv(msg.data(), n, MPI_BYTE, st.MPI_SOURCE, tag, side_,
                    MPI_STATUS_IGNORE) == MPI_SUCCESS;
  }

  std::string activity() const {
    if (!failed.empty())
      return "has failed: its " + failed + " timed out";
    if (waitingIn)
      return "is waiting in " + *waitingIn + " for " +
             seconds((p2pNowNs() - waitingSinceNs) * 1e-9) + " s";
    return "is computing (in no communication call)";
  }

  void serve(uint64_t now) {
    lastServeNs_ = now;
    sends_.remove_if([](Owned &o) {
      int done = 0;
      MPI_Test(&o.req, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    for (;;) {
      MPI_Status st;
      std::vector<uint8_t> msg;
      if (!take(kQuestionTag, msg, st))
        return;
      std::vector<int64_t> q;
      std::string unused;
      if (!decode(msg, q, unused) || q.size() < 3 || q[1] < 0 ||
          static_cast<size_t>(q[1]) > q.size() - 3)
        continue;
      size_t nTags = static_cast<size_t>(q[1]);
      if (q[2 + nTags] < 0 ||
          q.size() != 3 + nTags + static_cast<size_t>(q[2 + nTags]))
        continue;
      int asker = st.MPI_SOURCE;
      std::vector<int> members(q.begin() + 3 + nTags, q.end());
      auto e = entered.find(members);
      std::vector<int64_t> a{
          q[0], static_cast<int64_t>(nTags),
          static_cast<int64_t>(e == entered.end() ? 0 : e->second),
          !failed.empty() ? Answer::Failed
          : waitingIn     ? Answer::Waiting
                          : Answer::Computing};
      for (size_t i = 0; i < nTags; ++i) {
        std::pair<int, int64_t> key{asker, q[2 + i]};
        auto s = sent.find(key);
        auto r = received.find(key);
        a.push_back(static_cast<int64_t>(s == sent.end() ? 0 : s->second));
        a.push_back(
            static_cast<int64_t>(r == received.end() ? 0 : r->second));
      }
      post(asker, kAnswerTag, a, activity());
    }
  }

  MPI_Comm side_ = MPI_COMM_NULL;
  std::list<Owned> sends_;
  uint64_t nextQuestion_ = 1, lastServeNs_ = 0;
};

/// The process's witness (MPI_COMM_WORLD is per process, so is it).
std::shared_ptr<Witness> &theWitness() {
  static std::shared_ptr<Witness> w;
  return w;
}

/// Marks the witness as waiting in `what` (since `start`) while it lives.
class WaitMark {
public:
  WaitMark(Witness &w, const std::string &what, Clock::time_point start)
      : w_(w), prev_(w.waitingIn), prevSince_(w.waitingSinceNs) {
    w.waitingIn = &what;
    // The wait's own clock reading (p2pNowNs is this clock in ns).
    w.waitingSinceNs = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            start.time_since_epoch())
            .count());
  }
  ~WaitMark() {
    w_.waitingIn = prev_;
    w_.waitingSinceNs = prevSince_;
  }

private:
  Witness &w_;
  const std::string *prev_;
  uint64_t prevSince_;
};

/// What a wait waits for: the `seq`-th collective posted on the
/// communicator of `members`, or a message to `peer` of `tag` (delivery).
struct Awaited {
  const std::vector<int> *members = nullptr;
  uint64_t seq = 0;
  int peer = -1;
  int64_t tag = 0;
};

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

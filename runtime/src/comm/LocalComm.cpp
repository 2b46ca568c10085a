//===- LocalComm.cpp - single-process communicators -----------------------===//
//
// `local` with one rank (collectives are identities) and the thread world:
// every rank is a thread of this process; collectives exchange pointers to
// the members' buffers at a group barrier and each member computes its share
// directly from the others' memory:
//
//   publish(in, out, count) -> barrier A -> compute/copy -> barrier B
//
// Barrier B keeps every input alive (and unmodified) until all members have
// read it, so an in-place all_reduce is safe; the next collective's barrier A
// cannot complete before every member has left the previous one, so the
// per-rank staging buffers may be reused at once. all_reduce is
// reduce-scatter + all-gather through those staging buffers: member i sums
// elements [count*i/n, count*(i+1)/n) over members in member order (double)
// and every member copies all chunks back.
//
// Waits poll every 20 ms for an aborted world and fail after the timeout,
// naming the ranks that never arrived.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Rendezvous.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

using namespace mapp::rt;

bool mapp::rt::parseGroup(const std::string &s, Group &out) {
  if (s == "tp")
    out = Group::TP;
  else if (s == "dp")
    out = Group::DP;
  else if (s == "pp")
    out = Group::PP;
  else if (s == "ep")
    out = Group::EP;
  else if (s == "edp")
    out = Group::EDP;
  else if (s == "cp")
    out = Group::CP;
  else if (s == "world")
    out = Group::World;
  else
    return false;
  return true;
}

const char *mapp::rt::groupName(Group g) {
  switch (g) {
  case Group::World:
    return "world";
  case Group::TP:
    return "tp";
  case Group::DP:
    return "dp";
  case Group::PP:
    return "pp";
  case Group::EP:
    return "ep";
  case Group::EDP:
    return "edp";
  case Group::CP:
    return "cp";
  }
  return "?";
}

bool mapp::rt::parseReduceOp(const std::string &s, ReduceOp &out) {
  if (s == "sum")
    out = ReduceOp::Sum;
  else if (s == "max")
    out = ReduceOp::Max;
  else if (s == "avg")
    out = ReduceOp::Avg;
  else
    return false;
  return true;
}

std::vector<int> Layout::members(Group g, int r) const {
  std::vector<int> m;
  int t = tpOf(r), d = dpOf(r), p = ppOf(r);
  switch (g) {
  case Group::World:
    for (int i = 0; i < world(); ++i)
      m.push_back(i);
    break;
  case Group::TP:
    for (int i = 0; i < tp; ++i)
      m.push_back(rankOf(i, d, p));
    break;
  case Group::DP:
    for (int i = 0; i < dp; ++i)
      m.push_back(rankOf(t, i, p));
    break;
  case Group::EP: {
    int e = epSize(), first = d - d % e;
    for (int i = 0; i < e; ++i)
      m.push_back(rankOf(t, first + i, p));
    break;
  }
  case Group::EDP: {
    int e = epSize();
    for (int i = d % e; i < dp; i += e)
      m.push_back(rankOf(t, i, p));
    break;
  }
  case Group::CP: {
    int c = cpSize(), first = d - d % c;
    for (int i = 0; i < c; ++i)
      m.push_back(rankOf(t, first + i, p));
    break;
  }
  case Group::PP:
    for (int i = 0; i < pp; ++i)
      m.push_back(rankOf(t, d, i));
    break;
  }
  return m;
}

int CommGroup::indexOf(int rank) const {
  auto it = std::find(members.begin(), members.end(), rank);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

std::string CommGroup::str() const {
  std::ostringstream os;
  os << kind << " [";
  for (size_t i = 0; i < members.size(); ++i)
    os << (i ? "," : "") << members[i];
  os << "]";
  return os.str();
}

CommGroup Communicator::group(Group g) const {
  if (secondBase_ >= 0 && layout_.world() == secondBase_ &&
      secondBase_ + second_.world() == worldSize()) {
    CommGroup out{groupName(g), {}};
    if (g == Group::World) {
      for (int r = 0; r < worldSize(); ++r)
        out.members.push_back(r);
    } else if (rank() < secondBase_) {
      out.members = layout_.members(g, rank());
    } else {
      for (int r : second_.members(g, rank() - secondBase_))
        out.members.push_back(r + secondBase_);
    }
    return out;
  }
  Layout l = layout_;
  if (l.world() != worldSize())
    l = Layout{worldSize(), 1, 1};
  return {groupName(g), l.members(g, rank())};
}

CommGroup mapp::rt::resolveGroup(const Communicator &c,
                                 const std::string &group,
                                 const std::vector<int64_t> &ranks) {
  if (!ranks.empty()) {
    CommGroup g{"ranks", {}};
    for (int64_t r : ranks)
      g.members.push_back(static_cast<int>(r));
    std::sort(g.members.begin(), g.members.end());
    g.members.erase(std::unique(g.members.begin(), g.members.end()),
                    g.members.end());
    return g;
  }
  Group k;
  if (!parseGroup(group, k))
    fail("unknown group '", group, "' (tp, dp, pp, ep, world or ranks)");
  return c.group(k);
}

uint64_t mapp::rt::p2pNowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

P2PHandle Communicator::isend(const void *buf, size_t bytes, int peer,
                              int64_t tag) {
  auto r = std::make_shared<P2PRequest>();
  r->buf = const_cast<void *>(buf);
  r->bytes = bytes;
  r->peer = peer;
  r->tag = tag;
  r->sentNs = p2pNowNs();
  send(buf, bytes, peer, tag);
  r->completedNs = p2pNowNs();
  r->done = true;
  return r;
}

P2PHandle Communicator::irecv(void *, size_t, int peer, int64_t tag) {
  fail("irecv from rank ", peer, " (tag ", tag, "): communicator '", name(),
       "' has no asynchronous receives");
}

bool Communicator::test(P2PRequest &r) {
  if (!r.error.empty())
    fail(r.error);
  return r.done.load();
}

void Communicator::recvPosted(void *buf, size_t bytes, int peer,
                              int64_t tag) {
  P2PHandle r = irecv(buf, bytes, peer, tag);
  try {
    wait(*r);
    lastRecv_ = RecvStamps::of(*r);
  } catch (...) {
    cancel(*r); // nobody may write into `buf` once we have given up
    throw;
  }
}

int Communicator::waitAny(const std::vector<P2PRequest *> &reqs,
                          uint64_t deadlineNs) {
  for (size_t i = 0; i < reqs.size(); ++i)
    if (test(*reqs[i]))
      return static_cast<int>(i);
  if (deadlineNs)
    return -1;
  fail("waitAny: communicator '", name(), "' has no asynchronous receives");
}

namespace {

/// World of one rank: every group is {0}, so reductions leave the buffer as
/// it is (sum/max/avg of one contribution) and gathers copy.
class SoloComm final : public Communicator {
public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int worldSize() const override { return 1; }
  void allReduce(float *, int64_t, ReduceOp, const CommGroup &) override {}
  void allReduce(double *, int64_t, ReduceOp, const CommGroup &) override {}
  void allGather(const float *in, float *out, int64_t count,
                 const CommGroup &) override {
    if (in != out)
      std::memmove(out, in, static_cast<size_t>(count) * sizeof(float));
  }
  void reduceScatter(const float *in, float *out, int64_t count, ReduceOp,
                     const CommGroup &) override {
    if (in != out)
      std::memmove(out, in, static_cast<size_t>(count) * sizeof(float));
  }
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &) override {
    if (in != out)
      std::memmove(out, in, bytes);
  }
  void send(const void *, size_t, int peer, int64_t) override {
    fail("send to rank ", peer, ": the local communicator has one rank");
  }
  void recv(void *, size_t, int peer, int64_t) override {
    fail("recv from rank ", peer, ": the local communicator has one rank");
  }
  void barrier() override {}
  bool sharesAddressSpace() const override { return true; }
};

using Clock = std::chrono::steady_clock;

struct GroupState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t round = 0;
  int arrived = 0;
  std::vector<uint64_t> seen; // per member: last round it arrived at
  // Published per collective (valid between barrier A and barrier B).
  std::vector<const void *> in;
  std::vector<void *> stage;
  std::vector<int64_t> count;
};

class ThreadWorld;

class ThreadComm final : public Communicator {
public:
  ThreadComm(ThreadWorld &w, int rank) : world_(w), rank_(rank) {}
  std::string name() const override { return "local"; }
  bool sharesClockWith(int) const override { return true; }
  int rank() const override { return rank_; }
  int worldSize() const override;
  void allReduce(float *buf, int64_t count, ReduceOp op,
                 const CommGroup &g) override {
    allReduceT(buf, count, op, g);
  }
  void allReduce(double *buf, int64_t count, ReduceOp op,
                 const CommGroup &g) override {
    allReduceT(buf, count, op, g);
  }
  void allGather(const float *in, float *out, int64_t count,
                 const CommGroup &g) override;
  void reduceScatter(const float *in, float *out, int64_t count, ReduceOp op,
                     const CommGroup &g) override;
  void allToAll(const void *in, void *out, size_t bytes,
                const CommGroup &g) override;
  void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                 void *out, const std::vector<uint64_t> &recvBytes,
                 const CommGroup &g) override;
  void send(const void *buf, size_t bytes, int peer, int64_t tag) override;
  void recv(void *buf, size_t bytes, int peer, int64_t tag) override;
  P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag) override;
  int waitAny(const std::vector<P2PRequest *> &reqs,
              uint64_t deadlineNs) override;
  void barrier() override;
  bool sharesAddressSpace() const override { return true; }
  void cancel(P2PRequest &r) override;

private:
  template <typename T>
  void allReduceT(T *buf, int64_t count, ReduceOp op, const CommGroup &g);
  /// Publishes (in, stage, count), waits for all members (barrier A);
  /// returns the state and this rank's index.
  GroupState &enter(const CommGroup &g, const char *what, const void *in,
                    void *stage, int64_t count, int &idx);
  void wait(GroupState &s, const CommGroup &g, const char *what);

  ThreadWorld &world_;
  int rank_;
  std::vector<uint8_t> staging_;
};

class ThreadWorld final : public LocalWorld {
public:
  explicit ThreadWorld(int n) : n_(n) {}
  int size() const override { return n_; }
  std::unique_ptr<Communicator> connect(int rank) override {
    if (rank < 0 || rank >= n_)
      fail("local world of ", n_, " ranks has no rank ", rank);
    return std::make_unique<ThreadComm>(*this, rank);
  }
  void abort(int rank, const std::string &why) override {
    {
      std::lock_guard<std::mutex> lk(abortMu_);
      if (aborted_.load())
        return;
      abortRank_ = rank;
      abortWhy_ = why;
      aborted_.store(true);
    }
    mailCv_.notify_all();
    std::lock_guard<std::mutex> lk(groupsMu_);
    for (auto &[k, s] : groups_)
      s->cv.notify_all();
  }

  /// Throws when another rank failed.
  void checkAbort(int self, const std::string &what) {
    if (!aborted_.load())
      return;
    std::lock_guard<std::mutex> lk(abortMu_);
    if (abortRank_ == self)
      fail(what, ": this rank already failed");
    fail(what, ": rank ", abortRank_, " failed (", abortWhy_, ")");
  }

  GroupState &state(const CommGroup &g) {
    std::lock_guard<std::mutex> lk(groupsMu_);
    auto &s = groups_[g.members];
    if (!s) {
      s = std::make_unique<GroupState>();
      size_t n = g.members.size();
      s->seen.assign(n, 0);
      s->in.assign(n, nullptr);
      s->stage.assign(n, nullptr);
      s->count.assign(n, 0);
    }
    return *s;
  }

  /// A message nobody had posted a receive for yet.
  struct Mail {
    std::vector<uint8_t> data;
    uint64_t sentNs = 0, arrivedNs = 0;
  };
  using Key = std::tuple<int, int, int64_t>; // src, dst, tag
  std::mutex mailMu_;
  std::condition_variable mailCv_;
  std::map<Key, std::deque<Mail>> mail_;
  /// Receives posted before their message came, in posting order.
  std::map<Key, std::deque<P2PHandle>> posted_;

private:
  int n_;
  std::mutex groupsMu_;
  std::map<std::vector<int>, std::unique_ptr<GroupState>> groups_;
  std::mutex abortMu_;
  std::atomic<bool> aborted_{false};
  int abortRank_ = -1;
  std::string abortWhy_;
};

int ThreadComm::worldSize() const { return world_.size(); }

void ThreadComm::wait(GroupState &s, const CommGroup &g, const char *what) {
  std::unique_lock<std::mutex> lk(s.mu);
  int idx = g.indexOf(rank_);
  uint64_t my = s.round;
  s.seen[idx] = my + 1;
  if (++s.arrived == g.size()) {
    s.arrived = 0;
    ++s.round;
    s.cv.notify_all();
    return;
  }
  auto start = Clock::now();
  while (s.round == my) {
    s.cv.wait_for(lk, std::chrono::milliseconds(20));
    if (s.round != my)
      break;
    std::string w = std::string(what) + " over " + g.str();
    lk.unlock();
    world_.checkAbort(rank_, w);
    lk.lock();
    double waited =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (s.round == my && timeoutS_ > 0 && waited > timeoutS_) {
      std::ostringstream missing;
      for (size_t i = 0; i < g.members.size(); ++i)
        if (s.seen[i] != my + 1)
          missing << (missing.tellp() ? "," : "") << g.members[i];
      fail(w, " (rank ", rank_, "): timed out after ", timeoutS_,
           " s waiting for rank(s) ", missing.str(),
           " (dead rank, or a plan whose ranks disagree on the collectives)");
    }
  }
}

GroupState &ThreadComm::enter(const CommGroup &g, const char *what,
                              const void *in, void *stage, int64_t count,
                              int &idx) {
  idx = g.indexOf(rank_);
  if (idx < 0)
    fail(what, " over ", g.str(), ": rank ", rank_, " is not a member");
  GroupState &s = world_.state(g);
  s.in[idx] = in;
  s.stage[idx] = stage;
  s.count[idx] = count;
  wait(s, g, what);
  for (int i = 0; i < g.size(); ++i)
    if (s.count[i] != count)
      fail(what, " over ", g.str(), ": rank ", rank_, " has ", count,
           " elements, rank ", g.members[i], " has ", s.count[i],
           " (mismatched plan)");
  return s;
}

template <typename T>
void ThreadComm::allReduceT(T *buf, int64_t count, ReduceOp op,
                            const CommGroup &g) {
  int n = g.size();
  if (n == 1)
    return;
  int idx = g.indexOf(rank_);
  if (idx < 0)
    fail("all_reduce over ", g.str(), ": rank ", rank_, " is not a member");
  int64_t lo = count * idx / n, hi = count * (idx + 1) / n;
  staging_.resize(std::max<size_t>(1, (hi - lo) * sizeof(T)));
  GroupState &s = enter(g, "all_reduce", buf, staging_.data(), count, idx);
  T *mine = reinterpret_cast<T *>(staging_.data());
  for (int64_t e = lo; e < hi; ++e) {
    double acc = static_cast<const T *>(s.in[0])[e];
    for (int i = 1; i < n; ++i) {
      double v = static_cast<const T *>(s.in[i])[e];
      acc = op == ReduceOp::Max ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::Avg)
      acc /= n;
    mine[e - lo] = static_cast<T>(acc);
  }
  wait(s, g, "all_reduce"); // every chunk is reduced, every input read
  for (int i = 0; i < n; ++i) {
    int64_t l = count * i / n, h = count * (i + 1) / n;
    std::memcpy(buf + l, s.stage[i], (h - l) * sizeof(T));
  }
  wait(s, g, "all_reduce"); // staging read by all
}

void ThreadComm::allGather(const float *in, float *out, int64_t count,
                           const CommGroup &g) {
  int idx;
  GroupState &s = enter(g, "all_gather", in, nullptr, count, idx);
  for (int i = 0; i < g.size(); ++i)
    std::memcpy(out + i * count, s.in[i], count * sizeof(float));
  wait(s, g, "all_gather");
}

void ThreadComm::reduceScatter(const float *in, float *out, int64_t count,
                               ReduceOp op, const CommGroup &g) {
  int idx;
  GroupState &s = enter(g, "reduce_scatter", in, nullptr, count, idx);
  int n = g.size();
  for (int64_t e = 0; e < count; ++e) {
    double acc = static_cast<const float *>(s.in[0])[idx * count + e];
    for (int i = 1; i < n; ++i) {
      double v = static_cast<const float *>(s.in[i])[idx * count + e];
      acc = op == ReduceOp::Max ? std::max(acc, v) : acc + v;
    }
    if (op == ReduceOp::Avg)
      acc /= n;
    out[e] = static_cast<float>(acc);
  }
  wait(s, g, "reduce_scatter");
}

void ThreadComm::allToAll(const void *in, void *out, size_t bytes,
                          const CommGroup &g) {
  int idx;
  GroupState &s = enter(g, "all_to_all", in, nullptr,
                        static_cast<int64_t>(bytes), idx);
  for (int i = 0; i < g.size(); ++i)
    std::memcpy(static_cast<uint8_t *>(out) + i * bytes,
                static_cast<const uint8_t *>(s.in[i]) + idx * bytes, bytes);
  wait(s, g, "all_to_all");
}

// Counts agreed first (every member then knows every block's offset in
// every sender's buffer), so only the input pointers are published.
void ThreadComm::allToAllv(const void *in,
                           const std::vector<uint64_t> &sendBytes, void *out,
                           const std::vector<uint64_t> &recvBytes,
                           const CommGroup &g) {
  std::vector<uint64_t> rows = agreeCounts(sendBytes, recvBytes, g);
  int n = g.size();
  if (n == 1) {
    if (in != out && sendBytes[0])
      std::memmove(out, in, sendBytes[0]);
    return;
  }
  int idx;
  GroupState &s = enter(g, "all_to_allv", in, nullptr, n, idx);
  uint8_t *dst = static_cast<uint8_t *>(out);
  for (int i = 0; i < n; ++i) {
    const uint64_t *row = rows.data() + static_cast<size_t>(i) * 2 * n;
    uint64_t off = 0;
    for (int k = 0; k < idx; ++k)
      off += row[k];
    if (row[idx])
      std::memcpy(dst, static_cast<const uint8_t *>(s.in[i]) + off, row[idx]);
    dst += recvBytes[i];
  }
  wait(s, g, "all_to_allv"); // every sender's buffer read
}

void ThreadComm::barrier() {
  CommGroup g = group(Group::World);
  int idx;
  GroupState &s = enter(g, "barrier", nullptr, nullptr, 0, idx);
  wait(s, g, "barrier"); // nobody republishes before all checked counts
}

// The sender copies straight into a posted receive's buffer when there is
// one (a posted receive into a preallocated buffer), else into the mailbox.
void ThreadComm::send(const void *buf, size_t bytes, int peer, int64_t tag) {
  if (peer < 0 || peer >= world_.size() || peer == rank_)
    fail("send from rank ", rank_, " to rank ", peer, " (tag ", tag,
         "): no such peer in a world of ", world_.size());
  world_.checkAbort(rank_, "send to rank " + std::to_string(peer));
  uint64_t now = p2pNowNs();
  ThreadWorld::Key key{rank_, peer, tag};
  {
    std::lock_guard<std::mutex> lk(world_.mailMu_);
    auto it = world_.posted_.find(key);
    if (it != world_.posted_.end() && !it->second.empty()) {
      P2PHandle r = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty())
        world_.posted_.erase(it);
      if (r->bytes != bytes)
        r->error = "recv on rank " + std::to_string(peer) + " from rank " +
                   std::to_string(rank_) + " (tag " + std::to_string(tag) +
                   "): message has " + std::to_string(bytes) +
                   " bytes, expected " + std::to_string(r->bytes) +
                   " (mismatched plan)";
      else
        std::memcpy(r->buf, buf, bytes);
      r->sentNs = now;
      r->completedNs = r->pendingNs = p2pNowNs(); // exact: stamped here
      r->done = true;
    } else {
      ThreadWorld::Mail m;
      m.data.assign(static_cast<const uint8_t *>(buf),
                    static_cast<const uint8_t *>(buf) + bytes);
      m.sentNs = now;
      m.arrivedNs = p2pNowNs();
      world_.mail_[key].push_back(std::move(m));
    }
  }
  world_.mailCv_.notify_all();
}

P2PHandle ThreadComm::irecv(void *buf, size_t bytes, int peer, int64_t tag) {
  if (peer < 0 || peer >= world_.size() || peer == rank_)
    fail("recv on rank ", rank_, " from rank ", peer, " (tag ", tag,
         "): no such peer in a world of ", world_.size());
  auto r = std::make_shared<P2PRequest>();
  r->isRecv = true;
  r->buf = buf;
  r->bytes = bytes;
  r->peer = peer;
  r->tag = tag;
  ThreadWorld::Key key{peer, rank_, tag};
  std::lock_guard<std::mutex> lk(world_.mailMu_);
  auto it = world_.mail_.find(key);
  if (it != world_.mail_.end() && !it->second.empty()) {
    ThreadWorld::Mail m = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty())
      world_.mail_.erase(it);
    if (m.data.size() != bytes)
      r->error = "recv on rank " + std::to_string(rank_) + " from rank " +
                 std::to_string(peer) + " (tag " + std::to_string(tag) +
                 "): message has " + std::to_string(m.data.size()) +
                 " bytes, expected " + std::to_string(bytes) +
                 " (mismatched plan)";
    else
      std::memcpy(buf, m.data.data(), bytes);
    r->sentNs = m.sentNs;
    r->completedNs = r->pendingNs = m.arrivedNs; // exact: the sender's stamp
    r->done = true;
  } else {
    world_.posted_[key].push_back(r);
  }
  return r;
}

int ThreadComm::waitAny(const std::vector<P2PRequest *> &reqs,
                        uint64_t deadlineNs) {
  auto start = Clock::now();
  auto scan = [&]() -> int {
    for (size_t i = 0; i < reqs.size(); ++i)
      if (test(*reqs[i]))
        return static_cast<int>(i);
    return -1;
  };
  std::unique_lock<std::mutex> lk(world_.mailMu_);
  for (;;) {
    int i = scan();
    if (i >= 0)
      return i;
    uint64_t now = p2pNowNs();
    if (deadlineNs && now >= deadlineNs)
      return -1;
    auto wait = std::chrono::milliseconds(20);
    if (deadlineNs)
      wait = std::min<std::chrono::milliseconds>(
          wait, std::chrono::milliseconds((deadlineNs - now) / 1000000 + 1));
    world_.mailCv_.wait_for(lk, wait);
    lk.unlock();
    std::string what = "recv on rank " + std::to_string(rank_);
    if (!reqs.empty())
      what += " from rank " + std::to_string(reqs[0]->peer) + " (tag " +
              std::to_string(reqs[0]->tag) + ")";
    world_.checkAbort(rank_, what);
    double waited =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (timeoutS_ > 0 && waited > timeoutS_)
      fail(what, ": timed out after ", timeoutS_, " s",
           reqs.empty() ? std::string()
                        : " waiting for rank(s) " +
                              std::to_string(reqs[0]->peer),
           " (the sender is dead or the plan has no matching send)");
    lk.lock();
  }
}

void ThreadComm::cancel(P2PRequest &r) {
  std::lock_guard<std::mutex> lk(world_.mailMu_);
  auto it = world_.posted_.find({r.peer, rank_, r.tag});
  if (it == world_.posted_.end())
    return;
  auto &q = it->second;
  q.erase(std::remove_if(q.begin(), q.end(),
                         [&](const P2PHandle &h) { return h.get() == &r; }),
          q.end());
  if (q.empty())
    world_.posted_.erase(it);
}

void ThreadComm::recv(void *buf, size_t bytes, int peer, int64_t tag) {
  recvPosted(buf, bytes, peer, tag);
}

} // namespace

std::unique_ptr<Communicator> mapp::rt::createLocalComm() {
  return std::make_unique<SoloComm>();
}

std::unique_ptr<LocalWorld> mapp::rt::createLocalWorld(int worldSize) {
  if (worldSize < 1)
    fail("local world needs at least one rank");
  return std::make_unique<ThreadWorld>(worldSize);
}

#ifndef MAPP_HAVE_MPI
bool mapp::rt::haveMpiComm() { return false; }
std::unique_ptr<Communicator> mapp::rt::createMpiComm() {
  fail("--comm=mpi: this runtime was built without MPI (configure with "
       "-DMAPP_ENABLE_MPI=ON and libopenmpi-dev installed)");
}
void mapp::rt::mpiAbort(int) {}
void mapp::rt::mpiFinalize() {}
Blob mapp::rt::rendezvousMpi(int, int, const Blob &, double) {
  fail("rendezvous over MPI: this runtime was built without MPI (set "
       "MAPP_RENDEZVOUS_FILE or MASTER_ADDR/MASTER_PORT for the other paths)");
}
#endif

std::unique_ptr<Communicator> mapp::rt::createComm(const std::string &name) {
  if (name == "local")
    return createLocalComm();
  if (name == "mpi")
    return createMpiComm();
  if (name == "nccl")
    fail("--comm=nccl runs rank-threads: create it with createNcclWorld");
  fail("unknown communicator '", name, "' (choices: local, mpi)");
}

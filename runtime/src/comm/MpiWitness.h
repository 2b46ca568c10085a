//===- MpiWitness.h - who a timed-out MPI wait waits for -------*- C++ -*-===//
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
// Only MpiComm.cpp includes this; it also holds the MPI error helpers.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_COMM_MPI_WITNESS_H
#define MAPP_RT_COMM_MPI_WITNESS_H

#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace mapp::rt::mpi {

using Clock = std::chrono::steady_clock;

inline std::string mpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

inline void check(int rc, const std::string &what) {
  if (rc != MPI_SUCCESS)
    fail(what, ": MPI error: ", mpiError(rc));
}

template <typename T> MPI_Datatype mpiType();
template <> inline MPI_Datatype mpiType<float>() { return MPI_FLOAT; }
template <> inline MPI_Datatype mpiType<double>() { return MPI_DOUBLE; }

inline std::string seconds(double s) {
  std::ostringstream os;
  os.precision(s < 10 ? 2 : 3);
  os << s;
  return os.str();
}

inline std::string rankList(const std::vector<int> &ranks) {
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
inline std::shared_ptr<Witness> &theWitness() {
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

} // namespace mapp::rt::mpi

#endif

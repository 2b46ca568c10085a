//===- Comm.h - communicators -----------------------------------*- C++ -*-===//
//
// Collectives and point-to-point transfers between ranks. `local` runs every
// rank of the world as a thread of one process (shared-memory collectives),
// `mpi` runs one rank per MPI process; `nccl` (CUDA builds with NCCL) runs
// every rank as a thread with its own GPU and adds device collectives.
//
// Device memory. Host communicators move host memory only. A device backend
// asks two capabilities: sharesAddressSpace() (every rank is a thread of
// this process, so a device pointer one rank publishes is valid for all: the
// CUDA backend then moves payloads itself and uses the communicator only to
// rendezvous) and deviceImpl() (a device communicator's native state, e.g.
// NCCL's). With neither, the backend stages payloads through host memory.
//
// Groups. A collective runs over an explicit, ascending list of global ranks
// (a CommGroup). Named groups (tp|dp|pp|world) are resolved from the rank's
// coordinates in Megatron order (tp fastest, then dp, then pp; docs/plan-
// lowering.md): the tp group of rank r is the tp ranks that share r's dp
// and pp coordinates, and so on. Every member must call the same collectives
// of a group in the same order.
//
// Determinism. Reductions add the members' contributions in member order in
// double and round once, so every member gets bit-identical results, equal
// between the local and the MPI communicator.
//
// Point-to-point. send is buffered (eager): the bytes are copied and send
// returns without waiting for the receiver, so any order of sends and recvs
// that a valid (1F1B, interleaved, ...) schedule produces cannot deadlock.
// recv blocks until a message of (peer, tag) arrives. Messages of one
// (src, dst, tag) are received in send order.
//
// Asynchronous point-to-point (MegaDPP, docs/megadpp.md). isend returns a
// completed handle once the bytes are captured (the sender never waits for
// the receiver); irecv posts a receive into the caller's preallocated buffer
// (any dtype: the payload is bytes) and returns at once; test() polls a
// handle, waitAny() blocks on a condition variable (local) or a backed-off
// MPI_Test loop (mpi) until one of several completes. Posted receives and
// blocking recvs of one (src, dst, tag) match messages in posting order.
// Every message carries its sender's steady-clock send time, so a completed
// receive knows how long the transfer took (sentNs -> completedNs): the
// scheduler measures link bandwidth from the transfers themselves.
//
// Failure. A blocking call that waits longer than the communicator's
// timeout, or whose peer has failed, throws Error naming the operation, the
// group and the ranks that did not arrive — it never hangs.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_COMM_H
#define MAPP_RT_COMM_H

#include "mapp/rt/DType.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mapp::rt {

enum class ReduceOp { Sum, Max, Avg };
/// Parallel group a collective runs over (docs/semantics.md `group`).
/// EP: the expert-parallel group, EDP: the expert-data-parallel group (the
/// dp ranks holding the same experts; Layout::ep).
enum class Group { World, TP, DP, PP, EP, EDP, CP };
bool parseGroup(const std::string &s, Group &out);
bool parseReduceOp(const std::string &s, ReduceOp &out);
const char *groupName(Group g);

/// The world's parallel layout: rank = tp + tpSize*(dp + dpSize*pp).
/// Expert parallelism lives inside dp (Megatron): with ep dividing dp, the
/// EP group of a rank is the ep consecutive dp ranks d - d%ep .. that share
/// its tp and pp coordinates, its EDP group the dp ranks with the same d%ep.
/// ep = 0 (plans before the ep pass): EP is the whole dp group, EDP the
/// rank alone.
///
/// Context parallelism lives inside dp the same way: the CP group of a rank
/// is the cp consecutive dp ranks d - d%cp .. (they read the same rows; each
/// holds one load-balanced share of the sequence, docs/context-parallel.md).
/// Gradients are averaged over the whole dp group, cp ranks included.
struct Layout {
  int tp = 1, dp = 1, pp = 1, ep = 0, cp = 0;
  int world() const { return tp * dp * pp; }
  int tpOf(int r) const { return r % tp; }
  int dpOf(int r) const { return (r / tp) % dp; }
  int ppOf(int r) const { return r / (tp * dp); }
  int rankOf(int t, int d, int p) const { return t + tp * (d + dp * p); }
  /// The expert-parallel degree (ep, or dp when 0 or not dividing dp).
  int epSize() const { return ep > 0 && dp % ep == 0 ? ep : dp; }
  /// Index of rank r in its EP group and in its EDP group.
  int epOf(int r) const { return dpOf(r) % epSize(); }
  int edpOf(int r) const { return dpOf(r) / epSize(); }
  /// The context-parallel degree (cp, or 1 when 0 or not dividing dp).
  int cpSize() const { return cp > 0 && dp % cp == 0 ? cp : 1; }
  /// Members of rank r's group `g`, ascending.
  std::vector<int> members(Group g, int r) const;
};

/// A resolved group: ascending global ranks; `kind` names it in messages
/// and traces ("tp", "dp", "pp", "world", "ranks").
struct CommGroup {
  std::string kind;
  std::vector<int> members;
  int size() const { return static_cast<int>(members.size()); }
  /// Index of `rank` in members, -1 if absent.
  int indexOf(int rank) const;
  std::string str() const;
};

/// One asynchronous transfer (isend/irecv). `done` once complete; a receive
/// then holds the payload in `buf`.
struct P2PRequest {
  virtual ~P2PRequest() = default;
  bool isRecv = false;
  void *buf = nullptr;
  size_t bytes = 0;
  int peer = -1;
  int64_t tag = 0;
  std::atomic<bool> done{false};
  /// Steady clock (ns) of the sender's send call and of the moment the
  /// payload was complete at this rank (0 = unknown).
  uint64_t sentNs = 0, completedNs = 0;
  /// The landing lies in (pendingNs, completedNs]: the last time this rank
  /// saw the payload incomplete (0: its first look found it complete).
  /// Equal to completedNs where the landing is known exactly (a thread
  /// world's sender stamps it; an injected link delay decides it).
  uint64_t pendingNs = 0;
  /// Set by the matching side on a mismatch (size): test() throws it.
  std::string error;
};
using P2PHandle = std::shared_ptr<P2PRequest>;

/// Steady-clock nanoseconds, the clock of P2PRequest's stamps.
uint64_t p2pNowNs();

/// A completed receive's times (P2PRequest's; 0 = unknown), as the trace
/// records them.
struct RecvStamps {
  uint64_t sentNs = 0, pendingNs = 0, arrivedNs = 0;
  static RecvStamps of(const P2PRequest &r) {
    return {r.sentNs, r.pendingNs, r.completedNs};
  }
  /// Whether the landing time is exact rather than an interval.
  bool exact() const { return pendingNs == arrivedNs; }
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;

  /// The layout named groups resolve against (default: tp = world).
  void setLayout(const Layout &l) { layout_ = l; }
  const Layout &layout() const { return layout_; }
  /// MegaFBD: ranks [base, base + l.world()) form a second world of layout
  /// `l` (the forward side); the world group spans both.
  void setSecondLayout(const Layout &l, int base) {
    second_ = l;
    secondBase_ = base;
  }
  CommGroup group(Group g) const;
  /// Number of ranks in `g` that this rank belongs to.
  int groupSize(Group g) const { return group(g).size(); }

  // --- collectives over an explicit group (this rank must be a member) ---
  /// In-place reduction of `count` floats (doubles) over the group.
  virtual void allReduce(float *buf, int64_t count, ReduceOp op,
                         const CommGroup &g) = 0;
  virtual void allReduce(double *buf, int64_t count, ReduceOp op,
                         const CommGroup &g) = 0;
  /// out = concatenation over members (in member order) of `count` floats.
  virtual void allGather(const float *in, float *out, int64_t count,
                         const CommGroup &g) = 0;
  /// `in` holds size() blocks of `count` floats; member i gets the reduction
  /// of everybody's block i in `out`.
  virtual void reduceScatter(const float *in, float *out, int64_t count,
                             ReduceOp op, const CommGroup &g) = 0;
  /// `in` holds size() blocks of `bytes`; block j goes to member j, and
  /// out's block i comes from member i.
  virtual void allToAll(const void *in, void *out, size_t bytes,
                        const CommGroup &g) = 0;
  /// Variable all-to-all (expert-parallel dispatch and combine, docs/
  /// expert-parallel.md). `in` holds size() consecutive blocks, block j of
  /// sendBytes[j] bytes for member j; `out` gets size() consecutive blocks,
  /// block i of recvBytes[i] bytes from member i (recvBytes as given, or
  /// from exchangeCounts). Before any payload moves every member sees every
  /// member's counts (agreeCounts), so counts that disagree between two
  /// members fail on every member with the same Error naming the pair — not
  /// a hang, not a short read. A dead member is a timeout Error.
  /// The default packs the blocks to the largest one and runs allToAll; the
  /// thread world copies straight from the senders' memory, MPI runs
  /// MPI_Ialltoallv.
  virtual void allToAllv(const void *in, const std::vector<uint64_t> &sendBytes,
                         void *out, const std::vector<uint64_t> &recvBytes,
                         const CommGroup &g);
  /// The receive counts of a variable all-to-all: element i of the result is
  /// what member i sends this rank (an all_to_all of the counts).
  std::vector<uint64_t> exchangeCounts(const std::vector<uint64_t> &sendBytes,
                                       const CommGroup &g);
  /// Every member's (send, recv) count rows, gathered with allToAll and
  /// checked: member i's send to j must equal j's recv from i. Returns the
  /// gathered rows (n x 2n) so callers can compute offsets; Error naming
  /// the first disagreeing pair otherwise (the same on every member).
  std::vector<uint64_t> agreeCounts(const std::vector<uint64_t> &sendBytes,
                                    const std::vector<uint64_t> &recvBytes,
                                    const CommGroup &g);

  /// Buffered send / blocking recv of `bytes` to/from global rank `peer`.
  virtual void send(const void *buf, size_t bytes, int peer, int64_t tag) = 0;
  virtual void recv(void *buf, size_t bytes, int peer, int64_t tag) = 0;
  /// Asynchronous point-to-point (see the file comment). The defaults:
  /// isend is send() (buffered, so complete at once); irecv/test/waitAny
  /// fail, naming the communicator.
  virtual P2PHandle isend(const void *buf, size_t bytes, int peer,
                          int64_t tag);
  virtual P2PHandle irecv(void *buf, size_t bytes, int peer, int64_t tag);
  /// True once `r` is complete (throws its error, if any).
  virtual bool test(P2PRequest &r);
  /// Blocks until one of `reqs` is complete and returns its index (the
  /// lowest one done); -1 when `deadlineNs` (p2pNowNs clock, 0 = none)
  /// passes first. Error after the communicator's timeout.
  virtual int waitAny(const std::vector<P2PRequest *> &reqs,
                      uint64_t deadlineNs = 0);
  void wait(P2PRequest &r) { waitAny({&r}); }
  /// Withdraws a posted receive that is not complete (its buffer is about
  /// to go away); no-op for completed ones.
  virtual void cancel(P2PRequest &) {}
  /// The training step now running (time-windowed fault injection).
  virtual void setStep(int64_t) {}
  /// The times of this rank's last blocking recv (p2pNowNs clock): when
  /// its payload was complete here (the trace ends the recv there, not when
  /// the waiting thread woke up), when it was last seen incomplete, and
  /// when the sender called send (the sender's clock).
  RecvStamps lastRecvStamps() const { return lastRecv_; }
  /// Whether `peer`'s steady clock is this rank's (the same host), so a
  /// sentNs it stamped can be subtracted from this rank's completedNs.
  /// completedNs itself is always this rank's clock: exact where the sender
  /// stamps the landing (thread world), else when this rank's progress
  /// noticed the payload (MPI: at most a poll late while it waits, later
  /// when it was busy) — an upper bound either way.
  virtual bool sharesClockWith(int /*peer*/) const { return false; }
  /// Clears them, so a recv that does not set them reads as unknown.
  void forgetLastRecv() { lastRecv_ = {}; }

  virtual void barrier() = 0;
  /// Lets the transport move this rank's queued messages while it computes;
  /// the executor calls it after every op. MPI's sends and posted receives
  /// advance only inside MPI calls, so a rank that runs a ready task where
  /// a static schedule would wait held its outgoing messages back until
  /// its next communication call (and its peers then ran out of order).
  virtual void progress() {}
  /// Waits until every buffered send of this rank has been delivered.
  virtual void flush() {}

  /// True when every rank of the world is a thread of this process.
  virtual bool sharesAddressSpace() const { return false; }
  /// Ranks of the world running on this rank's host (processes that share
  /// its cores), this one included.
  virtual int ranksOnThisHost() const { return 1; }
  /// Native state of a device communicator (the CUDA backend knows its
  /// type: NCCL's per-rank handles); null for host communicators.
  virtual void *deviceImpl() const { return nullptr; }
  /// The GPU this rank's device backend runs on (NCCL: one per rank).
  virtual int deviceOrdinal() const { return 0; }

  // --- named-group conveniences ---
  void allReduce(float *buf, int64_t count, ReduceOp op, Group g) {
    allReduce(buf, count, op, group(g));
  }
  void allGather(const float *in, float *out, int64_t count, Group g) {
    allGather(in, out, count, group(g));
  }

  /// Seconds a blocking call waits before it fails (0 = forever).
  void setTimeout(double seconds) { timeoutS_ = seconds; }
  double timeout() const { return timeoutS_; }

protected:
  /// A blocking recv as irecv + wait, remembering the request's times (the
  /// last recv's); the posted receive is withdrawn if the wait fails.
  void recvPosted(void *buf, size_t bytes, int peer, int64_t tag);

  Layout layout_;
  Layout second_;
  int secondBase_ = -1; // -1: no second layout
  double timeoutS_ = 300;
  RecvStamps lastRecv_;
};

/// The group of a communication instr: `ranks` (explicit global ranks) when
/// given, else the named `group` ("tp"|"dp"|"pp"|"ep"|"world") resolved for
/// this rank. Error on an unknown name.
CommGroup resolveGroup(const Communicator &c, const std::string &group,
                       const std::vector<int64_t> &ranks);

/// Single-process communicator of world size 1: collectives are identities,
/// point-to-point is an Error (there is no peer).
std::unique_ptr<Communicator> createLocalComm();

/// Shared state of a world of ranks run as threads of one process.
class LocalWorld {
public:
  virtual ~LocalWorld() = default;
  virtual int size() const = 0;
  /// The communicator of `rank` (call once per rank, from any thread).
  virtual std::unique_ptr<Communicator> connect(int rank) = 0;
  /// Marks `rank` failed: every rank blocked in (or later entering) a call
  /// that needs it throws an Error that quotes `why`.
  virtual void abort(int rank, const std::string &why) = 0;
};
std::unique_ptr<LocalWorld> createLocalWorld(int worldSize);

/// True when this runtime was built with the MPI communicator.
bool haveMpiComm();
/// MPI_COMM_WORLD communicator (initializes MPI once; Error if not built).
std::unique_ptr<Communicator> createMpiComm();
/// MPI_Abort on COMM_WORLD when MPI is initialized (a rank's fatal error).
void mpiAbort(int code);
/// MPI_Finalize when MPI is initialized.
void mpiFinalize();

/// True when this runtime was built with the NCCL communicator.
bool haveNcclComm();
/// NCCL world of `worldSize` rank-threads of this process, rank r on device
/// r (one rank per GPU). Its communicators are host-capable (rendezvous and
/// host payloads go through a thread world) and carry NCCL handles for the
/// CUDA backend. Error when not built or when there are fewer GPUs than
/// ranks.
std::unique_ptr<LocalWorld> createNcclWorld(int worldSize);
/// The device of rank `rank` in an NCCL world of `worldSize` ranks on
/// `deviceCount` visible GPUs; Error (suggesting --comm=local, which runs
/// every rank on one device) when worldSize > deviceCount.
int ncclDeviceOf(int rank, int worldSize, int deviceCount);

/// "local" (world of one) or "mpi".
std::unique_ptr<Communicator> createComm(const std::string &name);

} // namespace mapp::rt

#endif

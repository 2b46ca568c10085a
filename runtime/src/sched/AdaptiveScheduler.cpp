//===- AdaptiveScheduler.cpp - dfc/bfc switched by links and memory -------===//
//
// Which tasks may run under either policy and the stash they reserve are the
// task pool's rules (mapp/rt/TaskPool.h; the deadlock-freedom argument is in
// TaskPool.cpp).
// This adds the communication: per step every task's receives are posted
// (forward input: recvs of forward blocks, backward input: recvs of backward
// blocks; forward/backward outputs leave through the send kernels, which
// never wait); a candidate is ready when its receives have arrived; the
// receives measure the links, which set the policy; the ranks of a tp group
// agree on every decision.
//
//===----------------------------------------------------------------------===//
#include "AdaptiveScheduler.h"
#include "LinkMonitor.h"
#include "mapp/rt/DType.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/TaskPool.h"

using namespace mapp::rt;
using namespace mapp::rt::sched;

namespace {

struct Recv {
  int peer = -1;
  int64_t tag = 0;
  bool forwardInput = true; // the buffer class: forward or backward input
  std::vector<uint8_t> buf; // preallocated message buffer
  size_t payloadBytes = 0;  // what the link carries (buf may be a letter)
  P2PHandle handle;
  bool sampled = false;
};

class AdaptiveScheduler final : public TaskScheduler {
public:
  AdaptiveScheduler(const Plan &plan, const Program &p, Communicator &comm,
                    const SchedOptions &o)
      : comm_(comm), pool_(plan, p, capOf(plan, o)),
        recvs_(pool_.size()),
        links_(plan.adaptive.slowLinkRatio, plan.adaptive.bandwidthSmoothing) {
    // The posted receives of every task, the buffer classes.
    for (size_t i = 0; i < pool_.size(); ++i) {
      const PoolTask &pt = pool_[i];
      for (const Instr &in : p.blocks[pt.task.block].instrs) {
        if (in.kernel != "recv")
          continue;
        Recv r;
        r.peer = static_cast<int>(in.attrs.getInt("peer", 0));
        r.tag = in.attrs.getInt("tag", 0) * plan.numMicrobatches +
                pt.task.microbatch;
        r.forwardInput = pt.forward;
        const Value &v = p.values[in.outputs[0]];
        r.payloadBytes =
            static_cast<size_t>(v.type.numel()) * dtypeSize(v.type.dtype);
        r.buf.resize(o.postedBytes ? o.postedBytes(v) : r.payloadBytes);
        recvs_[i].push_back(std::move(r));
      }
    }
    tpGroup_ = comm.group(Group::TP);
    ppGroup_ = comm.group(Group::PP);
    stats_.mode = "adaptive";
    stats_.capBytes = pool_.capBytes();
    stats_.stashBytes = pool_.stashBytes();
  }

  ~AdaptiveScheduler() override {
    cancelAll();
    for (PeerVerdict &p : peerVerdicts_)
      if (p.posted && !p.posted->done.load())
        comm_.cancel(*p.posted);
  }

  void beginStep(int64_t step) override {
    cancelAll();
    step_ = step;
    pool_.beginStep();
    for (std::vector<Recv> &rs : recvs_)
      for (Recv &r : rs) {
        r.handle = comm_.irecv(r.buf.data(), r.buf.size(), r.peer, r.tag);
        r.sampled = false;
      }
    sharePipelineVerdict();
  }

  bool next(Task &t) override {
    if (pool_.remaining() == 0)
      return false;
    for (;;) {
      std::vector<int> cand[2];
      std::vector<char> ready(pool_.size(), 0);
      for (int i = 0; i < static_cast<int>(pool_.size()); ++i) {
        if (!pool_.waiting(i))
          continue;
        for (int pol : {DFC, BFC})
          if (pool_.admissible(i, pol))
            cand[pol].push_back(i);
        ready[i] = arrived(i);
      }
      std::string why;
      bool slowLocal = links_.slow(comm_.rank(), why);
      if (!slowLocal && pipelineSlow_) {
        slowLocal = true;
        why = pipelineWhy_;
      }
      bool slowAny = slowLocal;
      std::vector<char> common = ready;
      if (tpGroup_.size() > 1) {
        // One small all-reduce per decision: the tp group agrees on the
        // slow flag and on which tasks are ready on every member.
        std::vector<double> buf(pool_.size() + 1, 0);
        buf[0] = slowLocal ? 1 : 0;
        for (size_t i = 0; i < pool_.size(); ++i)
          buf[i + 1] = ready[i];
        ++rounds_;
        try {
          comm_.allReduce(buf.data(), static_cast<int64_t>(buf.size()),
                          ReduceOp::Sum, tpGroup_);
        } catch (const Error &e) {
          fail(e.what(), "; adaptive scheduler of rank ", comm_.rank(),
               ", decision round ", rounds_, ", candidates ",
               describe(cand[policy_]));
        }
        slowAny = buf[0] > 0;
        if (slowAny && !slowLocal)
          why = "a tensor-parallel peer's link is slow";
        for (size_t i = 0; i < pool_.size(); ++i)
          common[i] = buf[i + 1] == tpGroup_.size();
      }
      int pol = slowAny && pool_.nextFits() ? BFC : DFC;
      if (pol != policy_) {
        SchedSwitch s;
        s.step = step_;
        s.ns = p2pNowNs();
        s.from = policyName(policy_);
        s.to = policyName(pol);
        if (pol == BFC)
          s.reason = why + "; the next microbatch's stash fits the cap";
        else if (!slowAny)
          s.reason = "no link is slow";
        else
          s.reason = "the cap (" + std::to_string(pool_.capBytes()) +
                     " bytes) holds no further microbatch";
        switches_.push_back(s);
        ++stats_.switches;
        policy_ = pol;
      }
      // The dfc limit on open microbatches yields when it would leave no
      // candidate at all (the cap still holds): progress comes first.
      const std::vector<int> &pool = cand[pol].empty() ? cand[BFC] : cand[pol];
      int pick = pool_.pick(pool, pol, &common);
      if (pick >= 0) {
        pool_.start(pick);
        stats_.peakStashBytes = pool_.peakStashBytes();
        t = pool_[pick].task;
        ++stats_.decisions;
        startNs_ = p2pNowNs();
        return true;
      }
      if (pool.empty())
        fail("adaptive scheduler on rank ", comm_.rank(), ", step ", step_ + 1,
             ": no task can run (", pool_.remaining(),
             " left; a plan whose tables disagree with its sends?)");
      // Wait for a receive of a candidate: block when nothing is ready here;
      // when something is ready here but not on a tp peer, wait a little
      // (the peer's message is on its way) and agree again.
      // A receive may have completed since `ready` was computed: then decide
      // again at once (waiting on the others alone could wait forever).
      std::vector<P2PRequest *> pending;
      bool localReady = false, fresh = false;
      for (int i : pool) {
        localReady |= ready[i] != 0;
        if (ready[i])
          continue;
        for (Recv &r : recvs_[i])
          if (comm_.test(*r.handle))
            fresh = true;
          else
            pending.push_back(r.handle.get());
      }
      if (fresh)
        continue;
      if (pending.empty()) {
        if (tpGroup_.size() > 1)
          continue; // ready here; a peer still waits: agree again
        fail("adaptive scheduler on rank ", comm_.rank(), ", step ", step_ + 1,
             ": candidates without receives are not ready (internal)");
      }
      uint64_t deadline = localReady ? p2pNowNs() + 2000000 : 0;
      try {
        comm_.waitAny(pending, deadline);
      } catch (const Error &e) {
        fail(e.what(), "; adaptive scheduler of rank ", comm_.rank(),
             " (policy ", policyName(pol), ", decision round ", rounds_,
             ") waits for ", describe(cand[pol]));
      }
    }
  }

  void finished(const Task &t) override {
    links_.taskTime(static_cast<double>(p2pNowNs() - startNs_));
    if (pool_.finish(t))
      return;
    fail("adaptive scheduler: finished task (block ", t.block, ", microbatch ",
         t.microbatch, ") was not handed out");
  }

  const void *received(const Task &t, int k, RecvStamps *stamps) override {
    for (size_t i = 0; i < pool_.size(); ++i)
      if (pool_[i].running && pool_[i].task.block == t.block &&
          pool_[i].task.microbatch == t.microbatch) {
        if (k < 0 || k >= static_cast<int>(recvs_[i].size()))
          fail("adaptive scheduler: recv ", k, " of block ", t.block,
               " was not posted");
        const auto &r = recvs_[i][k];
        if (stamps && r.handle)
          *stamps = RecvStamps::of(*r.handle);
        return r.buf.data();
      }
    return nullptr;
  }

  std::vector<SchedSwitch> takeSwitches() override {
    std::vector<SchedSwitch> s;
    s.swap(switches_);
    return s;
  }

  SchedStats stats() const override {
    SchedStats s = stats_;
    s.policy = policyName(policy_);
    s.transitNs = links_.transitNs();
    s.bytesPerS = links_.bytesPerS();
    return s;
  }
  bool handsOutOptimizer() const override { return false; }
  bool takesLinkVerdicts() const override { return true; }
  void linkVerdict(int src, bool slow) override {
    links_.monitorVerdict(src, slow);
  }

private:
  /// Only the receiver of a slow link measures it, but breadth-first pays
  /// only when the whole pipeline runs it (the stages upstream must run
  /// ahead with forwards). At each step's start a stage sends its verdict
  /// to the other stages and takes the latest verdict of each that has
  /// arrived: an all-reduce there was a barrier at every step start that
  /// static schedules do not have, so a peer's verdict now applies when it
  /// arrives (a step later at most).
  void sharePipelineVerdict() {
    pipelineSlow_ = false;
    if (ppGroup_.size() <= 1)
      return;
    std::string why;
    const bool here = links_.slow(comm_.rank(), why);
    const double mine = here ? 1 : 0;
    int slowStages = here ? 1 : 0;
    try {
      if (peerVerdicts_.empty()) {
        // Filled before posting: a posted receive holds &p.in.
        for (int r : ppGroup_.members)
          if (r != comm_.rank())
            peerVerdicts_.push_back(PeerVerdict{r});
        for (PeerVerdict &p : peerVerdicts_)
          postVerdict(p);
      }
      for (PeerVerdict &p : peerVerdicts_) {
        comm_.send(&mine, sizeof mine, p.rank, kPipelineVerdictTag);
        while (comm_.test(*p.posted)) { // the newest of what arrived counts
          p.slow = p.in > 0;
          postVerdict(p);
        }
        slowStages += p.slow ? 1 : 0;
      }
    } catch (const Error &e) {
      fail(e.what(), "; adaptive scheduler of rank ", comm_.rank(),
           ", sharing the pipeline's link verdict at step ", step_ + 1);
    }
    pipelineSlow_ = slowStages > 0;
    if (pipelineSlow_ && !here)
      pipelineWhy_ = "a link of this pipeline is slow (" +
                     std::to_string(slowStages) + " stage(s) measured it)";
  }

  struct PeerVerdict {
    int rank;
    double in = 0; // the posted receive's buffer
    P2PHandle posted;
    bool slow = false;
  };
  void postVerdict(PeerVerdict &p) {
    p.posted = comm_.irecv(&p.in, sizeof p.in, p.rank, kPipelineVerdictTag);
  }

  /// "(block b, mb m: recv from P tag T pending), ..." for an error.
  std::string describe(const std::vector<int> &ids) const {
    std::string out;
    for (int i : ids) {
      const Task &task = pool_[i].task;
      out += (out.empty() ? "(block " : ", (block ") +
             std::to_string(task.block) + " mb " +
             std::to_string(task.microbatch);
      for (const Recv &r : recvs_[i])
        out += std::string(r.handle->done.load() ? ": got " : ": waits ") +
               std::to_string(r.peer) + "/" + std::to_string(r.tag);
      out += ")";
    }
    return out.empty() ? "nothing" : out;
  }

  /// Every receive of task i complete; samples the link on first sight. The
  /// first step is warm-up, not a sample: MPI connects a pair on its first
  /// message, so step 0's transits read 10-20x the later ones and would
  /// set every link "slow" in a fault-free run.
  bool arrived(int i) {
    bool all = true;
    for (Recv &r : recvs_[i]) {
      if (!comm_.test(*r.handle)) {
        all = false;
        continue;
      }
      if (!r.sampled && step_ > 0) {
        r.sampled = true;
        links_.sample(r.peer, r.payloadBytes, r.handle->sentNs,
                      r.handle->completedNs);
      }
    }
    return all;
  }

  void cancelAll() {
    for (std::vector<Recv> &rs : recvs_)
      for (Recv &r : rs)
        if (r.handle && !r.handle->done.load()) {
          comm_.cancel(*r.handle);
          r.handle.reset();
        }
  }

  /// The cap on in-flight stash: --mem-cap, else the plan's policy, else
  /// the backend's free device memory (CUDA), else none.
  static uint64_t capOf(const Plan &plan, const SchedOptions &o) {
    if (o.memCapBytes)
      return o.memCapBytes;
    return plan.adaptive.memCapBytes ? plan.adaptive.memCapBytes
                                     : o.deviceFreeBytes;
  }

  Communicator &comm_;
  TaskPool pool_;
  std::vector<std::vector<Recv>> recvs_; // per pool task, posted each step
  LinkMonitor links_;
  CommGroup tpGroup_, ppGroup_;
  std::vector<PeerVerdict> peerVerdicts_; // the other pipeline stages
  bool pipelineSlow_ = false; // a stage's link was slow (step start)
  std::string pipelineWhy_;
  int64_t step_ = 0;
  int policy_ = DFC;
  int64_t rounds_ = 0; // tp agreement all-reduces so far
  uint64_t startNs_ = 0;
  std::vector<SchedSwitch> switches_;
  SchedStats stats_;
};

} // namespace

std::unique_ptr<TaskScheduler>
mapp::rt::sched::createAdaptiveScheduler(const Plan &plan, const Program &p,
                                         Communicator &comm,
                                         const SchedOptions &o) {
  return std::make_unique<AdaptiveScheduler>(plan, p, comm, o);
}

//===- ExecutorBlock.cpp - One block of instrs, part by part --------------===//
//
// Executor::runBlock: each instr of a block in order, as named parts of a
// BlockRun (the block's trace marks, compute run and CPU clock chain): a
// trace_begin opens a region, a trace_end closes it; any other instr is
// counted (collectives), timed, dispatched (a receive the adaptive
// scheduler posted, else the kernel fn), followed by the checks after it
// (expert tally, hook, NaN injection, finite check), its transfer's times
// handed to the open regions, slowed down (slow-compute injection) and
// recorded (auto-trace). Compute ops in a row make one record with
// setTraceComputeRuns.
//
// Why this shape: the parts are BlockRun's member functions, each reading
// the one state struct, so a reader holds one part at a time and
// Executor.h declares only the struct. BlockRun lives here, like StepRun in
// ExecutorStep.cpp, since no other file needs it. It sits on runBlock's
// stack and its parts are defined in the class, so they inline into the
// loop as the lambdas did: no std::function, no allocation and no virtual
// call that the loop did not make before.
//
//===----------------------------------------------------------------------===//
#include "ExecutorInstr.h"
#include "TraceSink.h"
#include "TraceVocab.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Executor.h"
#include "mapp/trace/TraceWriter.h"

#include <algorithm>
#include <chrono>
#include <thread>

using namespace mapp::rt;
using namespace mapp::rt::exec;

// The parts every instr runs, traced or not, are inlined whatever the
// compiler's size estimate: the loop was one function before (GCC 12 -O3
// left countComm and dispatch out of line without it).
#define HOT [[gnu::always_inline]] inline

/// One runBlock call.
struct Executor::BlockRun {
  Executor &ex;
  const int block, mb, slot;
  KernelContext &ctx;
  const Block &blk;
  const bool tr;        // this step is traced
  const bool autoTrace; // ... and the plan has no regions: a record per op
  const bool slow;      // slow-compute injection on this rank
  // Deferred marks (device events): the end of one region and the begin of
  // the next with no work between are the same point of the device's
  // execution, so they share one event. Host marks stay distinct readings.
  const bool shareMarks;
  uint64_t lastMark = 0;
  bool workSinceMark = true;
  int recvIndex = 0; // k-th recv of the block: the scheduler's posted one
  const mapp::TraceCategory computeCat;
  // setTraceComputeRuns: the open run of compute ops, one record for all.
  const bool runs;
  const Instr *runFirst = nullptr;
  uint64_t runT0 = 0;
  // The thread CPU clock (a system call) is read once per boundary: nested
  // trace_begins with nothing run between share one reading (an end's is
  // not shared: see closeRegion).
  uint64_t cpuChain = 0;
  bool cpuChained = false;

  /// One instr other than trace_begin / trace_end.
  struct Op {
    Prepared &pr;
    const Instr &in;
    // Comm bookkeeping (countComm).
    int group = -1;
    int64_t seq = -1, tag = -1;
    int peer = -1;
    // Its record and clocks (beginOp).
    bool inRun = false, opRecord = false, timeCpu = false;
    uint64_t t0 = 0, cpu0 = 0, slowT0 = 0;
    uint64_t opCpu = 0; // its thread CPU time (timeCpu only)
    explicit Op(Prepared &p) : pr(p), in(*p.instr) {}
  };

  /// What the instr moved, for the trace. Apart from Op because the
  /// scheduler and the kernel write it through pointers: Op's fields stay
  /// in registers.
  struct Transfer {
    // recv: when its message was sent and when it was complete here
    // (p2pNowNs, the trace's steady clock); the host trace records them so
    // mapp-scan sees the wire time even when the bytes beat the receiver.
    RecvStamps stamps;
    PeerBytes peers; // filled by a variable all_to_all when traced
  };

  BlockRun(Executor &e, int b, int m, int s, KernelContext &c)
      : ex(e), block(b), mb(m), slot(s), ctx(c), blk(e.prog_->blocks[b]),
        tr(e.tracing()), autoTrace(tr && !e.planHasTrace_),
        slow(e.slowFactor_ > 1), shareMarks(tr && e.sink_->deferred()),
        computeCat(blk.kind == BlockKind::Optimizer
                       ? mapp::TraceCategory::Optimizer
                       : mapp::TraceCategory::Compute),
        runs(autoTrace && e.computeRuns_) {}

  uint64_t mark() {
    if (!shareMarks || workSinceMark)
      lastMark = ex.sink_->mark();
    workSinceMark = false;
    return lastMark;
  }

  uint64_t cpuAtBoundary() {
    if (!cpuChained)
      cpuChain = mapp::MappTraceWriter::threadCpuNs();
    cpuChained = true;
    return cpuChain;
  }

  /// The fields every auto-traced record of this block shares.
  mapp::TraceRecord recordOf(const Instr &i, mapp::TraceCategory cat) const {
    mapp::TraceRecord rec;
    rec.setName(i.name.empty() ? i.kernel.c_str() : i.name.c_str());
    rec.cat = cat;
    rec.phase = phaseOf(blk.kind);
    rec.step = static_cast<int32_t>(ex.step_);
    rec.microbatch = blk.kind == BlockKind::Optimizer ? -1 : mb;
    rec.chunk = blk.chunk;
    rec.layer = i.layer;
    return rec;
  }

  /// trace_begin (traced steps): a region opens here.
  void openRegion(Prepared &pr) {
    uint64_t t = mark();
    ex.open_.push_back(
        {pr.region.id, &pr, t,
         ex.cpuTimed_ && pr.region.timesCpu ? cpuAtBoundary() : 0, mb,
         blk.chunk});
  }

  /// trace_end (traced steps): the innermost open region of its id becomes
  /// a record.
  void closeRegion(const Prepared &pr) {
    const int64_t id = pr.region.id;
    std::vector<OpenRegion> &open = ex.open_;
    for (size_t k = open.size(); k-- > 0;) {
      if (open[k].id != id)
        continue;
      OpenRegion o = open[k];
      open.erase(open.begin() + k);
      const Prepared::Region &g = o.begin->region;
      mapp::TraceRecord rec;
      rec.setName(g.name.c_str());
      rec.cat = g.cat;
      rec.op = o.op;
      rec.phase = phaseOf(blk.kind);
      rec.step = static_cast<int32_t>(ex.step_);
      rec.microbatch = o.mb;
      rec.chunk = o.chunk;
      rec.layer = g.layer;
      rec.bytes = o.bytes ? o.bytes : g.bytes;
      rec.group = o.group;
      rec.seq = o.seq;
      rec.peer = o.peer;
      rec.tag = o.tag;
      if (rec.op != mapp::TraceOp::None)
        rec.cat = mapp::TraceCategory::Comm;
      rec.beginNs = o.t0;
      if (rec.cat != mapp::TraceCategory::Comm && ex.cpuTimed_) {
        cpuChained = false;
        rec.cpuNs = std::max<uint64_t>(cpuAtBoundary() - o.cpu0, 1);
        // Not shared with the next begin: appending this record (a lock,
        // the sink) would be charged to the next region, which made the
        // slow-rank verdicts of busy 2-core CI hosts flaky.
        cpuChained = false;
      }
      rec.endNs = mark();
      rec.setRecvStamps(o.stamps.sentNs, o.stamps.pendingNs,
                        o.stamps.arrivedNs);
      rec.peerBytes = o.peerBytes;
      ex.sink_->appendMarked(rec);
      return;
    }
  }

  /// The open run of compute ops (setTraceComputeRuns) becomes one record.
  void closeRun() {
    if (!runFirst)
      return;
    mapp::TraceRecord rec = recordOf(*runFirst, computeCat);
    rec.beginNs = runT0;
    rec.endNs = mark();
    ex.sink_->appendMarked(rec);
    runFirst = nullptr;
  }

  /// Comm bookkeeping: a collective's per-group issue number, counted
  /// always so members agree whatever steps are traced; a p2p's peer and
  /// tag. The open regions take the comm's fields.
  HOT void countComm(Op &op) {
    if (op.pr.kind != Prepared::Comm)
      return;
    const mapp::TraceOp kind = op.pr.op;
    if (kind == mapp::TraceOp::Send || kind == mapp::TraceOp::Recv) {
      op.peer = static_cast<int>(op.in.attrs.getInt("peer", 0));
      op.tag = op.in.attrs.getInt("tag", 0) * ex.plan_.numMicrobatches + mb;
    } else {
      op.seq = ex.groupSeq_[op.pr.group.members]++;
      if (tr)
        op.group = ex.traceGroup(op.pr.group);
    }
    if (tr)
      for (OpenRegion &o : ex.open_) {
        o.op = kind;
        o.group = op.group;
        o.seq = op.seq;
        o.peer = op.peer;
        o.tag = op.tag;
        o.bytes = op.pr.bytes;
      }
  }

  /// Before the instr: the compute run it joins or ends, its own record's
  /// begin mark, and the clocks its CPU time and slow-down start from.
  HOT void beginOp(Op &op) {
    op.inRun = runs && op.pr.kind == Prepared::Compute;
    if (runs && !op.inRun)
      closeRun();
    if (op.inRun && !runFirst) {
      runFirst = &op.in;
      runT0 = mark();
    }
    op.opRecord = autoTrace && !op.inRun;
    op.t0 = op.opRecord ? mark() : 0;
    op.timeCpu = (op.opRecord && ex.cpuTimed_) || (slow && ex.cpuTimed_);
    op.cpu0 = op.timeCpu ? mapp::MappTraceWriter::threadCpuNs() : 0;
    op.slowT0 = slow ? mapp::MappTraceWriter::nowNs() : 0;
  }

  /// Runs the instr: a recv the scheduler posted is taken from its buffer,
  /// anything else calls the kernel fn. An error names the step, microbatch,
  /// block and op.
  HOT void dispatch(Op &op, Transfer &moved) {
    Prepared &pr = op.pr;
    KernelArgs args{pr.instr->attrs,
                    pr.ins[slot].data(),
                    static_cast<int>(pr.ins[slot].size()),
                    pr.outs[slot].data(),
                    static_cast<int>(pr.outs[slot].size()),
                    ctx};
    try {
      const void *got =
          pr.op == mapp::TraceOp::Recv && ex.sched_
              ? ex.sched_->received({block, mb}, recvIndex++, &moved.stamps)
              : nullptr;
      if (got) {
        takePosted(op, got);
      } else {
        if (pr.op == mapp::TraceOp::Recv)
          ex.comm_.forgetLastRecv();
        ctx.peerBytes =
            tr && pr.op == mapp::TraceOp::AllToAll ? &moved.peers : nullptr;
        pr.fn(args);
        ctx.peerBytes = nullptr;
        if (pr.op == mapp::TraceOp::Recv) {
          moved.stamps = ex.comm_.lastRecvStamps();
        }
      }
    } catch (const Error &e) {
      fail("step ", ex.step_ + 1, ", microbatch ", mb, ", block ", block, ", ",
           pr.instr->kernel,
           pr.instr->name.empty() ? std::string() : " '" + pr.instr->name + "'",
           ": ", e.what());
    }
  }

  /// A recv the adaptive scheduler posted: its payload `got` into the
  /// instr's output.
  void takePosted(Op &op, const void *got) {
    // A device backend's letter: the payload moves on the device.
    // Otherwise the posted buffer holds the plan type; a device backend
    // may store the value as bf16 (writeFloats rounds it there).
    const Tensor &out = op.pr.outs[slot][0];
    const int v = op.pr.instr->outputs[0];
    Backend &backend = ex.backend_;
    if (backend.takePostedRecv(ex.comm_, got, out, op.peer, op.tag)) {
    } else if (ex.prog_->values[v].type.dtype == DType::F32) {
      backend.writeFloats(*ex.prog_, v, out.data, 0, out.numel(),
                          static_cast<const float *>(got));
    } else {
      backend.copyToStorage(out.data, got,
                            static_cast<size_t>(out.numel()) *
                                dtypeSize(out.type.dtype));
    }
  }

  /// After the instr: the expert tally and the instr hook (both within the
  /// op's CPU time), then the NaN injection and the finite check (not).
  HOT void afterInstr(Op &op) {
    const Prepared &pr = op.pr;
    const Instr &in = op.in;
    if (ex.countExperts_ && pr.kind == Prepared::Compute &&
        in.kernel == "moe_assign" && pr.outs[slot].size() == 2)
      ex.expertTally_.record(in.name.empty() ? in.kernel : in.name, mb,
                             pr.outs[slot][1], ex.backend_);
    if (ex.instrHook_ && ex.hookBlock_) {
      // The hook reads and writes storage from the host: the device must
      // have finished the instr (a no-op on the CPU).
      ex.backend_.synchronize();
      ex.instrHook_(ex, *pr.instr);
    }
    workSinceMark = true;
    op.opCpu = op.timeCpu ? mapp::MappTraceWriter::threadCpuNs() - op.cpu0 : 0;
    if (ex.nanStep_ == ex.step_ && pr.kind == Prepared::Compute)
      ex.injectNan(in, slot);
    if (ex.checkFinite_ && pr.kind == Prepared::Compute)
      ex.checkOutputsFinite(in, block, mb, slot);
  }

  /// The recv's stamps this trace can use, and a variable all_to_all's peer
  /// bytes, given to the open regions.
  HOT void noteTransfer(const Op &op, Transfer &moved) {
    // `arrived` is this rank's clock, exact (a thread world's sender stamps
    // the landing) or when its progress noticed the payload (MPI): an upper
    // bound of the landing either way, which is what the receiver waited
    // for. `sent` only where the sender's clock is this rank's. Device
    // marks: another timeline.
    if (!moved.stamps.arrivedNs || !tr || ex.sink_->deferred())
      moved.stamps = {};
    else if (!ex.comm_.sharesClockWith(op.peer))
      moved.stamps.sentNs = 0;
    const PeerBytes &peers = moved.peers;
    if (tr && !peers.send.empty() && !autoTrace)
      for (OpenRegion &o : ex.open_)
        o.peerBytes = ex.trace_->storePeerBytes(peers.send, peers.recv);
    if (tr && op.pr.op == mapp::TraceOp::Recv)
      for (OpenRegion &o : ex.open_) {
        o.stamps = moved.stamps;
      }
  }

  /// Slow-compute injection (compute ops): the op takes slowFactor_ times
  /// as long.
  void slowDown(Op &op) {
    const double factor = ex.slowFactor_;
    if (ex.cpuTimed_) {
      // A slower core: the op costs the thread factor x its CPU time,
      // whatever else shares the host.
      uint64_t until = op.cpu0 + static_cast<uint64_t>(
                                     static_cast<double>(op.opCpu) * factor);
      while (mapp::MappTraceWriter::threadCpuNs() < until) {
      }
      op.opCpu = mapp::MappTraceWriter::threadCpuNs() - op.cpu0;
    } else {
      uint64_t d = mapp::MappTraceWriter::nowNs() - op.slowT0;
      std::this_thread::sleep_for(std::chrono::nanoseconds(
          static_cast<int64_t>(static_cast<double>(d) * (factor - 1))));
    }
  }

  /// The op's own auto-trace record.
  void recordOp(const Op &op, const Transfer &moved) {
    const Prepared &pr = op.pr;
    mapp::TraceRecord rec =
        recordOf(op.in, pr.kind == Prepared::Comm ? mapp::TraceCategory::Comm
                                                  : computeCat);
    rec.op = pr.op;
    if (pr.kind != Prepared::Comm && ex.cpuTimed_)
      rec.cpuNs = std::max<uint64_t>(op.opCpu, 1);
    if (pr.kind == Prepared::Comm) {
      rec.bytes = pr.bytes;
      if (!moved.peers.send.empty())
        rec.peerBytes =
            ex.trace_->storePeerBytes(moved.peers.send, moved.peers.recv);
      rec.group = op.group;
      rec.seq = op.seq;
      rec.peer = op.peer;
      rec.tag = op.tag;
    }
    rec.beginNs = op.t0;
    rec.endNs = mark();
    // A blocking recv ends when its bytes were complete, not when the
    // waiting thread got the core back (host marks share that clock).
    const RecvStamps &s = moved.stamps;
    if (pr.op == mapp::TraceOp::Recv && !ex.sink_->deferred()) {
      if (s.arrivedNs > rec.beginNs && s.arrivedNs < rec.endNs)
        rec.endNs = s.arrivedNs;
      rec.setRecvStamps(s.sentNs, s.pendingNs, s.arrivedNs);
    }
    ex.sink_->appendMarked(rec);
  }
};

void Executor::runBlock(int block, int mb, int slot, KernelContext &ctx) {
  ctx.microbatch = mb;
  BlockRun b(*this, block, mb, slot, ctx);
  for (Prepared &pr : blocks_[block]) {
    if (pr.kind == Prepared::TraceBegin) {
      if (b.tr)
        b.openRegion(pr);
      continue;
    }
    if (pr.kind == Prepared::TraceEnd) {
      if (b.tr)
        b.closeRegion(pr);
      continue;
    }
    BlockRun::Op op(pr);
    BlockRun::Transfer moved;
    // Re-partitioning times compute instrs alone (the kernel and an injected
    // slow-down), never the communicator's progress or waits: a process
    // polling MPI burns CPU while it waits, which is no stage's work.
    const bool cpuTimed = timeCompute_ && pr.kind == Prepared::Compute;
    uint64_t cpu0 = cpuTimed ? mapp::MappTraceWriter::threadCpuNs() : 0;
    b.cpuChained = false; // an instr runs: the clock must be read again
    b.countComm(op);
    b.beginOp(op);
    b.dispatch(op, moved);
    uint64_t spent = cpuTimed ? mapp::MappTraceWriter::threadCpuNs() - cpu0 : 0;
    comm_.progress();
    b.afterInstr(op);
    b.noteTransfer(op, moved);
    if (b.slow && pr.kind == Prepared::Compute) {
      cpu0 = cpuTimed ? mapp::MappTraceWriter::threadCpuNs() : 0;
      b.slowDown(op);
      spent += cpuTimed ? mapp::MappTraceWriter::threadCpuNs() - cpu0 : 0;
    }
    if (op.opRecord)
      b.recordOp(op, moved);
    if (cpuTimed) {
      computeCpuNs_ += spent;
      if (pr.workLayer >= 0)
        layerCpuNs_ += spent;
      if (b.blk.kind != BlockKind::Optimizer)
        mbCpuNs_ += spent;
    }
  }
  b.closeRun();
}

#undef HOT

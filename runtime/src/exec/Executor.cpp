//===- Executor.cpp -------------------------------------------------------===//
#include "mapp/rt/Executor.h"
#include "mapp/rt/Fbd.h"
#include "ExecutorInstr.h"
#include "TraceSink.h"
#include "TraceVocab.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ThreadPool.h"
#include "mapp/trace/TraceWriter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

using namespace mapp::rt;
using namespace mapp::rt::exec;

Executor::Executor(const Plan &plan, Backend &backend, Communicator &comm)
    : plan_(plan), backend_(backend), comm_(comm),
      traceEvery_(plan.traceEvery), traceWindow_(plan.traceWindow),
      cpuTimed_(backend.name() == "cpu" && !backend.traceMarksDeferred() &&
                backend.pool().size() == 1) {
  if (plan.worldSize != comm.worldSize())
    fail("plan is for world_size ", plan.worldSize, " but communicator '",
         comm.name(), "' has ", comm.worldSize(), " rank(s)",
         comm.name() == "mpi" ? " (start it with mpirun -np " +
                                    std::to_string(plan.worldSize) + ")"
                              : std::string());
  // The layout (tp x dp x pp = world, one program per rank at its Megatron
  // coordinates) was checked by the plan verifier (PlanVerify.cpp).
  Layout layout{plan.tp, plan.dp, plan.pp, plan.ep, plan.cp};
  // MegaFBD: the forward side's ranks follow the layout's (docs/megafbd.md).
  Layout fwdLayout = fbdForwardLayout(plan);
  comm.setLayout(layout);
  if (isFbdPlan(plan))
    comm.setSecondLayout(fwdLayout, layout.world());
  for (const Program &p : plan.programs)
    if (p.rank == comm.rank())
      prog_ = &p;
  if (!prog_)
    fail("plan has no program for rank ", comm.rank());
  if (hasBf16Storage(*prog_) && !backend.storesBf16()) {
    f32Program_ = withF32Storage(*prog_);
    prog_ = &f32Program_;
  }
  const Program &p = *prog_;
  int r = comm.rank();
  pool_ = static_cast<uint8_t *>(backend.allocate(p.persistentBytes));
  // Slots start 64-byte aligned whatever arena_bytes is: with an odd
  // arena_bytes every value of slot 1 was misaligned (found by
  // mapp-fuzz-plan under UBSan).
  arenaStride_ = (p.arenaBytes + 63) / 64 * 64;
  arena_ = static_cast<uint8_t *>(
      backend.allocate(arenaStride_ * static_cast<uint64_t>(p.slots)));
  backend.bindProgram(p, pool_, arena_);
  initLossScale();

  for (size_t b = 0; b < p.blocks.size(); ++b) {
    std::vector<Prepared> prepared;
    bool writesLoss = false;
    for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
      const Instr &in = p.blocks[b].instrs[i];
      Prepared pr;
      pr.instr = &in;
      pr.fn = isExecutorKernel(in.kernel) ? nullptr : backend.lookup(in.kernel);
      pr.op = traceOpOf(in.kernel);
      if (in.kernel == "trace_begin" || in.kernel == "trace_end") {
        pr.kind = in.kernel == "trace_begin" ? Prepared::TraceBegin
                                             : Prepared::TraceEnd;
        planHasTrace_ = true;
        Prepared::Region &g = pr.region;
        g.id = in.attrs.getInt("id", -1);
        if (pr.kind == Prepared::TraceBegin) {
          g.name = in.attrs.getStr("name", in.name);
          g.cat = categoryOf(in.attrs.getStr("category", "compute"));
          g.layer = static_cast<int32_t>(in.attrs.getInt("layer", in.layer));
          g.bytes = static_cast<uint64_t>(
              std::max<int64_t>(0, in.attrs.getInt("bytes", 0)));
          // A comm instr before the matching trace_end makes it a comm
          // record, which carries no CPU time.
          g.timesCpu = g.cat != mapp::TraceCategory::Comm;
          const auto &ins = p.blocks[b].instrs;
          for (size_t j = i + 1; j < ins.size() && g.timesCpu; ++j) {
            if (ins[j].kernel == "trace_end" &&
                ins[j].attrs.getInt("id", -1) == g.id)
              break;
            if (traceOpOf(ins[j].kernel) != mapp::TraceOp::None)
              g.timesCpu = false;
          }
        }
        prepared.push_back(std::move(pr));
        continue;
      }
      if (pr.op != mapp::TraceOp::None) {
        pr.kind = Prepared::Comm;
        const Value &v = p.values[in.inputs.empty() ? in.outputs[0]
                                                    : in.inputs[0]];
        pr.bytes = v.bytes;
        if (pr.op != mapp::TraceOp::Send && pr.op != mapp::TraceOp::Recv) {
          std::vector<int64_t> ranks;
          if (in.attrs.has("ranks"))
            ranks = in.attrs.getInts("ranks");
          try {
            pr.group = resolveGroup(comm, in.attrs.getStr("group", "dp"),
                                    ranks);
          } catch (const Error &e) {
            fail("plan: instr ", i, " (", in.kernel, ") in block ", b, ": ",
                 e.what());
          }
          if (pr.group.indexOf(r) < 0)
            fail("plan: instr ", i, " (", in.kernel, ") in block ", b,
                 ": rank ", r, " is not in its group ", pr.group.str());
        }
      }
      if (!pr.fn)
        fail("plan: instr ", i, " (", in.kernel, ") in block ", b,
             ": backend '", backend.name(), "' has no such kernel");
      for (int s = 0; s < p.slots; ++s) {
        std::vector<Tensor> ti, to;
        for (int v : in.inputs)
          ti.push_back(backend.operandView(
              p, in, v, false, {valueData(v, s), p.values[v].type}));
        for (int v : in.outputs) {
          to.push_back(backend.operandView(
              p, in, v, true, {valueData(v, s), p.values[v].type}));
          writesLoss |= v == p.loss;
        }
        pr.ins.push_back(std::move(ti));
        pr.outs.push_back(std::move(to));
      }
      prepared.push_back(std::move(pr));
    }
    blocks_.push_back(std::move(prepared));
    blockWritesLoss_.push_back(writesLoss);
  }
  setScheduler({});

  // Which Grad values this rank counts in the global norm: every gradient
  // once in the world. Replicas over tp (params not sharded over tp) count on
  // tp index 0, replicas over dp on dp index 0 (the plan has synchronized
  // them before the optimizer), and a parameter held by several pipeline
  // stages (tied embeddings) on the lowest of them.
  std::map<std::string, int> lowestStage;
  for (const Program &q : plan.programs)
    for (const Value &v : q.values)
      if (v.kind == ValueKind::Param) {
        auto it = lowestStage.find(v.name);
        if (it == lowestStage.end() || q.pp < it->second)
          lowestStage[v.name] = q.pp;
      }
  // ZeRO-1: a gradient whose update carries zero_begin/zero_end is final
  // only in that range on this rank (its bucket was reduce-scattered over
  // dp); every dp rank counts its own range, which partition the bucket.
  normRange_.assign(p.values.size(), {0, -1});
  std::vector<bool> zeroSharded(p.values.size(), false);
  for (const Block &blk : p.blocks)
    for (const Instr &in : blk.instrs)
      if ((in.kernel == "adamw" || in.kernel == "sgd") &&
          in.attrs.has("zero_begin") && in.inputs.size() > 1) {
        int g = in.inputs[1];
        zeroSharded[g] = true;
        normRange_[g] = {in.attrs.getInt("zero_begin", 0),
                         in.attrs.getInt("zero_end", 0)};
      }
  countInNorm_.assign(p.values.size(), false);
  for (size_t v = 0; v < p.values.size(); ++v) {
    const Value &val = p.values[v];
    if (val.kind != ValueKind::Grad)
      continue;
    const Value &par = p.values[val.param];
    std::string sg = par.shardDim >= 0 ? par.shardGroup : "";
    // Expert weights (shard_group "ep") are replicas over the
    // expert-data-parallel group: counted on its first member.
    bool dpCounts = sg == "dp" || p.dp == 0 || zeroSharded[v] ||
                    (sg == "ep" && p.dp / expertDegree(plan) == 0);
    bool count = (sg == "tp" || p.tp == 0) && dpCounts &&
                 lowestStage[par.name] == p.pp;
    countInNorm_[v] = count;
  }
}

void Executor::setScheduler(const SchedOptions &o) {
  std::string mode = o.mode.empty()
                         ? (plan_.schedule == "adaptive" ? "adaptive" : "static")
                         : o.mode;
  SchedOptions so = o;
  so.mode = mode;
  if (!so.deviceFreeBytes)
    so.deviceFreeBytes = backend_.freeDeviceBytes();
  if (mode == "adaptive" && !so.postedBytes)
    so.postedBytes = [this](const Value &v) {
      return backend_.postedRecvBytes(comm_, v);
    };
  sched_ = createScheduler(plan_, *prog_, comm_, so);
  schedPostsReceives_ = sched_->stats().mode == "adaptive";
}

Executor::~Executor() {
  sink_.reset(); // appends what is still held while the backend lives
  backend_.release(pool_);
  backend_.release(arena_);
}

float *Executor::valueData(int v, int slot) const {
  const Value &val = prog_->values[v];
  uint8_t *base = inArena(val.kind)
                      ? arena_ + static_cast<uint64_t>(slot) * arenaStride_
                      : pool_;
  return reinterpret_cast<float *>(base + val.offset);
}

void Executor::writeFloats(int v, int slot, int64_t offset, const float *src,
                           int64_t n) {
  backend_.writeFloats(*prog_, v, valueData(v, slot), offset, n, src);
}

std::vector<float> Executor::readFloats(int v, int slot, int64_t offset,
                                        int64_t n) const {
  std::vector<float> out(static_cast<size_t>(n));
  backend_.readFloats(*prog_, v, valueData(v, slot), offset, n, out.data());
  return out;
}

double Executor::gradNormSquared() const {
  std::vector<Tensor> grads;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Grad || !countInNorm_[v])
      continue;
    // Only the rank's ZeRO range counts (the whole buffer without one).
    auto [lo, hi] = normRange_[v];
    int64_t n = val.type.numel();
    lo = std::max<int64_t>(lo, 0);
    hi = hi < 0 ? n : std::min(hi, n);
    if (hi <= lo)
      continue;
    TensorType range{val.type.dtype, {hi - lo}};
    grads.push_back({valueData(static_cast<int>(v)) + lo, range});
  }
  return backend_.sumSquares(grads);
}

void Executor::runBlock(int block, int mb, int slot, KernelContext &ctx) {
  ctx.microbatch = mb;
  const bool tr = tracing();
  const bool autoTrace = tr && !planHasTrace_;
  const bool slow = slowFactor_ > 1;
  const Block &blk = prog_->blocks[block];
  // Deferred marks (device events): the end of one region and the begin of
  // the next with no work between are the same point of the device's
  // execution, so they share one event. Host marks stay distinct readings.
  const bool shareMarks = tr && sink_->deferred();
  uint64_t lastMark = 0;
  bool workSinceMark = true;
  int recvIndex = 0; // k-th recv of the block: the scheduler's posted one
  auto mark = [&] {
    if (!shareMarks || workSinceMark)
      lastMark = sink_->mark();
    workSinceMark = false;
    return lastMark;
  };
  // The fields every auto-traced record of this block shares.
  auto recordOf = [&](const Instr &i, mapp::TraceCategory cat) {
    mapp::TraceRecord rec;
    rec.setName(i.name.empty() ? i.kernel.c_str() : i.name.c_str());
    rec.cat = cat;
    rec.phase = phaseOf(blk.kind);
    rec.step = static_cast<int32_t>(step_);
    rec.microbatch = blk.kind == BlockKind::Optimizer ? -1 : mb;
    rec.chunk = blk.chunk;
    rec.layer = i.layer;
    return rec;
  };
  const mapp::TraceCategory computeCat = blk.kind == BlockKind::Optimizer
                                             ? mapp::TraceCategory::Optimizer
                                             : mapp::TraceCategory::Compute;
  // setTraceComputeRuns: the open run of compute ops, one record for all.
  const bool runs = autoTrace && computeRuns_;
  const Instr *runFirst = nullptr;
  uint64_t runT0 = 0;
  // The thread CPU clock (a system call) is read once per boundary: nested
  // trace_begins with nothing run between share one reading (an end's is
  // not shared: see the trace_end below).
  uint64_t cpuChain = 0;
  bool cpuChained = false;
  auto cpuAtBoundary = [&] {
    if (!cpuChained)
      cpuChain = mapp::MappTraceWriter::threadCpuNs();
    cpuChained = true;
    return cpuChain;
  };
  auto closeRun = [&] {
    if (!runFirst)
      return;
    mapp::TraceRecord rec = recordOf(*runFirst, computeCat);
    rec.beginNs = runT0;
    rec.endNs = mark();
    sink_->appendMarked(rec);
    runFirst = nullptr;
  };
  for (Prepared &pr : blocks_[block]) {
    const Instr &in = *pr.instr;
    if (pr.kind == Prepared::TraceBegin) {
      if (tr) {
        uint64_t t = mark();
        open_.push_back({pr.region.id, &pr, t,
                         cpuTimed_ && pr.region.timesCpu ? cpuAtBoundary() : 0,
                         mb, blk.chunk});
      }
      continue;
    }
    if (pr.kind == Prepared::TraceEnd) {
      if (!tr)
        continue;
      const int64_t id = pr.region.id;
      for (size_t k = open_.size(); k-- > 0;) {
        if (open_[k].id != id)
          continue;
        OpenRegion o = open_[k];
        open_.erase(open_.begin() + k);
        const Prepared::Region &g = o.begin->region;
        mapp::TraceRecord rec;
        rec.setName(g.name.c_str());
        rec.cat = g.cat;
        rec.op = o.op;
        rec.phase = phaseOf(blk.kind);
        rec.step = static_cast<int32_t>(step_);
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
        if (rec.cat != mapp::TraceCategory::Comm && cpuTimed_) {
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
        sink_->appendMarked(rec);
        break;
      }
      continue;
    }
    cpuChained = false; // an instr runs: the clock must be read again
    // Collective bookkeeping: per-group issue numbers, counted always so
    // members agree whatever steps are traced.
    int group = -1;
    int64_t seq = -1, tag = -1;
    int peer = -1;
    if (pr.kind == Prepared::Comm) {
      if (pr.op == mapp::TraceOp::Send || pr.op == mapp::TraceOp::Recv) {
        peer = static_cast<int>(in.attrs.getInt("peer", 0));
        tag = in.attrs.getInt("tag", 0) * plan_.numMicrobatches + mb;
      } else {
        seq = groupSeq_[pr.group.members]++;
        if (tr)
          group = traceGroup(pr.group);
      }
      if (tr)
        for (OpenRegion &o : open_) {
          o.op = pr.op;
          o.group = group;
          o.seq = seq;
          o.peer = peer;
          o.tag = tag;
          o.bytes = pr.bytes;
        }
    }
    const bool inRun = runs && pr.kind == Prepared::Compute;
    if (runs && !inRun)
      closeRun();
    if (inRun && !runFirst) {
      runFirst = &in;
      runT0 = mark();
    }
    const bool opRecord = autoTrace && !inRun;
    uint64_t t0 = opRecord ? mark() : 0;
    const bool timeCpu = (opRecord && cpuTimed_) || (slow && cpuTimed_);
    uint64_t cpu0 = timeCpu ? mapp::MappTraceWriter::threadCpuNs() : 0;
    uint64_t slowT0 = slow ? mapp::MappTraceWriter::nowNs() : 0;
    KernelArgs args{pr.instr->attrs,
                    pr.ins[slot].data(),
                    static_cast<int>(pr.ins[slot].size()),
                    pr.outs[slot].data(),
                    static_cast<int>(pr.outs[slot].size()),
                    ctx};
    // recv: when its message was sent and when it was complete here
    // (p2pNowNs, the trace's steady clock); the host trace records them so
    // mapp-scan sees the wire time even when the bytes beat the receiver.
    RecvStamps stamps;
    PeerBytes peers; // filled by a variable all_to_all when traced
    try {
      const void *got = pr.op == mapp::TraceOp::Recv && sched_
                            ? sched_->received({block, mb}, recvIndex++,
                                               &stamps)
                            : nullptr;
      if (got) {
        // A device backend's letter: the payload moves on the device.
        // Otherwise the posted buffer holds the plan type; a device backend
        // may store the value as bf16 (writeFloats rounds it there).
        const Tensor &out = pr.outs[slot][0];
        const int v = pr.instr->outputs[0];
        if (backend_.takePostedRecv(comm_, got, out, peer, tag)) {
        } else if (prog_->values[v].type.dtype == DType::F32) {
          backend_.writeFloats(*prog_, v, out.data, 0, out.numel(),
                               static_cast<const float *>(got));
        } else {
          backend_.copyToStorage(out.data, got,
                                 static_cast<size_t>(out.numel()) *
                                     dtypeSize(out.type.dtype));
        }
      } else {
        if (pr.op == mapp::TraceOp::Recv)
          comm_.forgetLastRecv();
        ctx.peerBytes = tr && pr.op == mapp::TraceOp::AllToAll ? &peers : nullptr;
        pr.fn(args);
        ctx.peerBytes = nullptr;
        if (pr.op == mapp::TraceOp::Recv) {
          stamps = comm_.lastRecvStamps();
        }
      }
    } catch (const Error &e) {
      fail("step ", step_ + 1, ", microbatch ", mb, ", block ", block, ", ",
           pr.instr->kernel,
           pr.instr->name.empty() ? std::string() : " '" + pr.instr->name + "'",
           ": ", e.what());
    }
    comm_.progress();
    if (countExperts_ && pr.kind == Prepared::Compute &&
        in.kernel == "moe_assign" && pr.outs[slot].size() == 2)
      expertTally_.record(in.name.empty() ? in.kernel : in.name, mb,
                          pr.outs[slot][1], backend_);
    if (instrHook_ && hookBlock_) {
      // The hook reads and writes storage from the host: the device must
      // have finished the instr (a no-op on the CPU).
      backend_.synchronize();
      instrHook_(*this, *pr.instr);
    }
    workSinceMark = true;
    uint64_t opCpu = timeCpu ? mapp::MappTraceWriter::threadCpuNs() - cpu0 : 0;
    if (nanStep_ == step_ && pr.kind == Prepared::Compute)
      injectNan(in, slot);
    if (checkFinite_ && pr.kind == Prepared::Compute)
      checkOutputsFinite(in, block, mb, slot);
    // `arrived` is this rank's clock, exact (a thread world's sender stamps
    // the landing) or when its progress noticed the payload (MPI): an upper
    // bound of the landing either way, which is what the receiver waited
    // for. `sent` only where the sender's clock is this rank's. Device
    // marks: another timeline.
    if (!stamps.arrivedNs || !tr || sink_->deferred())
      stamps = {};
    else if (!comm_.sharesClockWith(peer))
      stamps.sentNs = 0;
    if (tr && !peers.send.empty() && !autoTrace)
      for (OpenRegion &o : open_)
        o.peerBytes = trace_->storePeerBytes(peers.send, peers.recv);
    if (tr && pr.op == mapp::TraceOp::Recv)
      for (OpenRegion &o : open_) {
        o.stamps = stamps;
      }
    if (slow && pr.kind == Prepared::Compute) {
      if (cpuTimed_) {
        // A slower core: the op costs the thread factor x its CPU time,
        // whatever else shares the host.
        uint64_t until = cpu0 + static_cast<uint64_t>(
                                    static_cast<double>(opCpu) * slowFactor_);
        while (mapp::MappTraceWriter::threadCpuNs() < until) {
        }
        opCpu = mapp::MappTraceWriter::threadCpuNs() - cpu0;
      } else {
        uint64_t d = mapp::MappTraceWriter::nowNs() - slowT0;
        std::this_thread::sleep_for(std::chrono::nanoseconds(
            static_cast<int64_t>(static_cast<double>(d) * (slowFactor_ - 1))));
      }
    }
    if (opRecord) {
      mapp::TraceRecord rec = recordOf(
          in, pr.kind == Prepared::Comm ? mapp::TraceCategory::Comm : computeCat);
      rec.op = pr.op;
      if (pr.kind != Prepared::Comm && cpuTimed_)
        rec.cpuNs = std::max<uint64_t>(opCpu, 1);
      if (pr.kind == Prepared::Comm) {
        rec.bytes = pr.bytes;
        if (!peers.send.empty())
          rec.peerBytes = trace_->storePeerBytes(peers.send, peers.recv);
        rec.group = group;
        rec.seq = seq;
        rec.peer = peer;
        rec.tag = tag;
      }
      rec.beginNs = t0;
      rec.endNs = mark();
      // A blocking recv ends when its bytes were complete, not when the
      // waiting thread got the core back (host marks share that clock).
      if (pr.op == mapp::TraceOp::Recv && !sink_->deferred()) {
        if (stamps.arrivedNs > rec.beginNs && stamps.arrivedNs < rec.endNs)
          rec.endNs = stamps.arrivedNs;
        rec.setRecvStamps(stamps.sentNs, stamps.pendingNs, stamps.arrivedNs);
      }
      sink_->appendMarked(rec);
    }
  }
  closeRun();
}

void Executor::runForward(const int32_t *tokens, const int32_t *targets,
                          int64_t step) {
  const Program &p = *prog_;
  size_t n = static_cast<size_t>(plan_.microBatchSize) * plan_.seqLength;
  if (p.tokens >= 0)
    backend_.copyToStorage(valueData(p.tokens, 0), tokens, n * sizeof(int32_t));
  if (p.targets >= 0)
    backend_.copyToStorage(valueData(p.targets, 0), targets, n * sizeof(int32_t));
  for (size_t b = 0; b < p.blocks.size(); ++b)
    if (p.blocks[b].kind == BlockKind::Forward)
      runBlockOnce(static_cast<int>(b), step);
}

void Executor::runBlockOnce(int block, int64_t step) {
  if (block < 0 || block >= static_cast<int>(blocks_.size()))
    fail("runBlockOnce: block ", block, " out of range (", blocks_.size(),
         " blocks)");
  // Device backends refresh state here (CUDA: bf16 parameter shadows after
  // loadParams).
  backend_.beginStep(step);
  KernelContext ctx;
  ctx.step = step;
  ctx.maxGradNorm = plan_.maxGradNorm;
  ctx.pool = &backend_.pool();
  ctx.comm = &comm_;
  ctx.probe = probe_;
  ctx.backend = &backend_;
  hookBlock_ = true;
  try {
    runBlock(block, 0, 0, ctx);
  } catch (...) {
    hookBlock_ = false;
    throw;
  }
  hookBlock_ = false;
  backend_.synchronize();
}

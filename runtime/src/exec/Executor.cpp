//===- Executor.cpp -------------------------------------------------------===//
#include "mapp/rt/Executor.h"
#include "mapp/rt/PlanLimits.h"
#include "mapp/rt/Fbd.h"
#include "ExecutorInstr.h"
#include "TraceSink.h"
#include "TraceVocab.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/ThreadPool.h"
#include "mapp/trace/TraceWriter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

  const std::vector<std::vector<int>> layers = workLayers(p);
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    std::vector<Prepared> prepared;
    bool writesLoss = false;
    for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
      const Instr &in = p.blocks[b].instrs[i];
      Prepared pr;
      pr.instr = &in;
      pr.workLayer = layers[b][i];
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
  so.microbatches = microbatches_;
  schedOptions_ = o;
  if (!so.deviceFreeBytes)
    so.deviceFreeBytes = backend_.freeDeviceBytes();
  if (mode == "adaptive" && !so.postedBytes)
    so.postedBytes = [this](const Value &v) {
      return backend_.postedRecvBytes(comm_, v);
    };
  sched_ = createScheduler(plan_, *prog_, comm_, so);
  schedPostsReceives_ = sched_->stats().mode == "adaptive";
}

void Executor::setMicrobatches(int k) {
  if (k < 1 || k > kMaxMicrobatches)
    fail("an uneven data-parallel split gives this rank ", k,
         " microbatches (must be 1..", kMaxMicrobatches, ")");
  microbatches_ = k;
  setScheduler(schedOptions_);
  if (sched_->stats().mode != "static")
    fail("an uneven data-parallel split needs the static scheduler");
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

//===- Executor.cpp -------------------------------------------------------===//
#include "mapp/rt/Executor.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Weights.h"

#include <cmath>
#include <cstring>
#include <limits>

using namespace mapp::rt;

/// An instr resolved against the backend with operand views per slot, so the
/// hot loop only calls a function pointer.
struct Executor::Prepared {
  const Instr *instr;
  KernelFn fn;
  std::vector<std::vector<Tensor>> ins, outs; // [slot][operand]
};

Executor::Executor(const Plan &plan, Backend &backend, Communicator &comm)
    : plan_(plan), backend_(backend), comm_(comm) {
  if (plan.worldSize != comm.worldSize())
    fail("plan is for world_size ", plan.worldSize, " but communicator '",
         comm.name(), "' has ", comm.worldSize(),
         " rank(s); run one process per rank with a matching --comm");
  for (const Program &p : plan.programs)
    if (p.rank == comm.rank())
      prog_ = &p;
  if (!prog_)
    fail("plan has no program for rank ", comm.rank());
  const Program &p = *prog_;
  pool_ = static_cast<uint8_t *>(backend.allocate(p.persistentBytes));
  arena_ = static_cast<uint8_t *>(
      backend.allocate(p.arenaBytes * static_cast<uint64_t>(p.slots)));
  backend.bindProgram(p, pool_, arena_);

  for (size_t b = 0; b < p.blocks.size(); ++b) {
    std::vector<Prepared> prepared;
    bool writesLoss = false;
    for (size_t i = 0; i < p.blocks[b].instrs.size(); ++i) {
      const Instr &in = p.blocks[b].instrs[i];
      Prepared pr{&in, backend.lookup(in.kernel), {}, {}};
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
}

Executor::~Executor() {
  backend_.release(pool_);
  backend_.release(arena_);
}

float *Executor::valueData(int v, int slot) const {
  const Value &val = prog_->values[v];
  uint8_t *base = inArena(val.kind)
                      ? arena_ + static_cast<uint64_t>(slot) * prog_->arenaBytes
                      : pool_;
  return reinterpret_cast<float *>(base + val.offset);
}

void Executor::initParams(uint64_t seed) {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param)
      continue;
    // Staged through host memory: storage may live on a device.
    std::vector<float> host(static_cast<size_t>(val.type.numel()));
    initParam(val.name, val.type.shape, seed, host.data());
    backend_.copyToStorage(valueData(static_cast<int>(v)), host.data(),
                           host.size() * sizeof(float));
  }
}

void Executor::loadParams(const Safetensors &st, const std::string &where) {
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind != ValueKind::Param)
      continue;
    auto it = st.tensors.find(val.name);
    if (it == st.tensors.end())
      fail(where, ": missing tensor '", val.name, "' (shape ",
           shapeStr(val.type.shape), ")");
    if (it->second.shape != val.type.shape)
      fail(where, ": tensor '", val.name, "' has shape ",
           shapeStr(it->second.shape), ", the plan needs ",
           shapeStr(val.type.shape));
    if (it->second.dtype == DType::I32 || it->second.dtype == DType::I64)
      fail(where, ": tensor '", val.name, "' is an integer tensor");
    std::vector<float> f = it->second.toF32(val.name);
    backend_.copyToStorage(valueData(static_cast<int>(v)), f.data(),
                           f.size() * 4);
  }
}

Safetensors Executor::saveParams() const {
  Safetensors st;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Param)
      st.tensors[val.name] =
          StTensor::fromF32(val.type.shape, hostCopy(static_cast<int>(v)).data());
  }
  st.metadata["format"] = "pt";
  st.metadata["step"] = std::to_string(step_);
  return st;
}

Safetensors Executor::saveGrads() const {
  Safetensors st;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Grad)
      st.tensors[prog_->values[val.param].name] =
          StTensor::fromF32(val.type.shape, hostCopy(static_cast<int>(v)).data());
  }
  st.metadata["step"] = std::to_string(step_);
  return st;
}

std::vector<float> Executor::hostCopy(int v) const {
  const Value &val = prog_->values[v];
  std::vector<float> host(static_cast<size_t>(val.type.numel()));
  backend_.copyFromStorage(host.data(), valueData(v), host.size() * sizeof(float));
  return host;
}

double Executor::gradNorm() const {
  std::vector<Tensor> grads;
  for (size_t v = 0; v < prog_->values.size(); ++v) {
    const Value &val = prog_->values[v];
    if (val.kind == ValueKind::Grad)
      grads.push_back({valueData(static_cast<int>(v)), val.type});
  }
  double s = backend_.sumSquares(grads);
  // Each rank holds a disjoint share of the gradients (TP/PP shards); DP
  // replicas would be averaged by the plan's all_reduce before this point.
  return std::sqrt(s);
}

void Executor::runBlock(int block, int mb, int slot, KernelContext &ctx) {
  ctx.microbatch = mb;
  for (Prepared &pr : blocks_[block]) {
    KernelArgs args{pr.instr->attrs,
                    pr.ins[slot].data(),
                    static_cast<int>(pr.ins[slot].size()),
                    pr.outs[slot].data(),
                    static_cast<int>(pr.outs[slot].size()),
                    ctx};
    try {
      pr.fn(args);
    } catch (const Error &e) {
      fail("step ", step_, ", microbatch ", mb, ", block ", block, ", ",
           pr.instr->kernel,
           pr.instr->name.empty() ? std::string() : " '" + pr.instr->name + "'",
           ": ", e.what());
    }
  }
}

StepResult Executor::step(const BatchFn &batches, const GradHook &afterGrads) {
  const Program &p = *prog_;
  KernelContext ctx;
  ctx.step = step_;
  ctx.maxGradNorm = plan_.maxGradNorm;
  ctx.pool = &backend_.pool();
  ctx.comm = &comm_;
  ctx.backend = &backend_;
  backend_.beginStep(step_);

  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].kind == ValueKind::Grad)
      backend_.zeroStorage(valueData(static_cast<int>(v)), p.values[v].bytes);

  // Default schedule when the table is empty: every non-optimizer block in
  // order for each microbatch.
  std::vector<Task> tasks = p.tasks;
  if (tasks.empty())
    for (int mb = 0; mb < plan_.numMicrobatches; ++mb)
      for (size_t b = 0; b < p.blocks.size(); ++b)
        if (p.blocks[b].kind != BlockKind::Optimizer)
          tasks.push_back({static_cast<int>(b), mb});

  StepResult r;
  r.step = step_;
  std::vector<int> slotMb(p.slots, -1);
  // Filled by readScalarAsync; valid after the synchronize() below.
  std::vector<float> losses(plan_.numMicrobatches,
                            std::numeric_limits<float>::quiet_NaN());
  std::vector<int> optimizerBlocks;
  bool optimizerInTable = false;
  for (size_t b = 0; b < p.blocks.size(); ++b)
    if (p.blocks[b].kind == BlockKind::Optimizer)
      optimizerBlocks.push_back(static_cast<int>(b));
  bool gradsDone = false;
  auto finishGrads = [&] {
    if (gradsDone)
      return;
    gradsDone = true;
    if (afterGrads)
      afterGrads(*this);
    ctx.gradNorm = r.gradNorm = gradNorm();
  };

  for (const Task &t : tasks) {
    if (p.blocks[t.block].kind == BlockKind::Optimizer) {
      optimizerInTable = true;
      finishGrads();
      runBlock(t.block, t.microbatch, 0, ctx);
      continue;
    }
    int slot = t.microbatch % p.slots;
    if (slotMb[slot] != t.microbatch) {
      slotMb[slot] = t.microbatch;
      if ((p.tokens >= 0 || p.targets >= 0) && batches) {
        // A rank may hold only tokens (first stage) or only targets (last).
        // Filled in host memory, then copied into storage (maybe a device).
        size_t n = static_cast<size_t>(plan_.microBatchSize) * plan_.seqLength;
        std::vector<int32_t> tok(n), tgt(n);
        batches(step_, t.microbatch, tok.data(), tgt.data());
        if (p.tokens >= 0)
          backend_.copyToStorage(valueData(p.tokens, slot), tok.data(),
                                 n * sizeof(int32_t));
        if (p.targets >= 0)
          backend_.copyToStorage(valueData(p.targets, slot), tgt.data(),
                                 n * sizeof(int32_t));
        r.tokens += static_cast<int64_t>(plan_.microBatchSize) * plan_.seqLength;
      }
    }
    runBlock(t.block, t.microbatch, slot, ctx);
    if (blockWritesLoss_[t.block])
      backend_.readScalarAsync(&losses[t.microbatch], valueData(p.loss, slot));
  }
  finishGrads();
  if (!optimizerInTable)
    for (int b : optimizerBlocks)
      runBlock(b, 0, 0, ctx);
  backend_.endStep();
  backend_.synchronize();

  double sum = 0;
  int n = 0;
  for (float l : losses)
    if (!std::isnan(l)) {
      sum += l;
      ++n;
    }
  r.loss = n ? sum / n : std::numeric_limits<double>::quiet_NaN();
  r.lr = 0;
  for (int b : optimizerBlocks)
    for (const Instr &in : p.blocks[b].instrs)
      if ((in.kernel == "adamw" || in.kernel == "sgd") && r.lr == 0)
        r.lr = scheduledLr(in.attrs, step_);
  ++step_;
  return r;
}

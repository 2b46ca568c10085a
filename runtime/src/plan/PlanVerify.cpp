//===- PlanVerify.cpp - semantic checks of a decoded plan -----------------===//
//
// Everything the executor relies on without re-checking: indices in range,
// storage inside the arena/pool, byte sizes matching dtype x shape, kernel
// names known, operand counts and shapes as docs/semantics.md states, and
// the world's layout (verifyLayout): tp x dp x pp (+ a MegaFBD forward side)
// = world_size, one program per rank, each at its Megatron coordinates.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Error.h"
#include "mapp/rt/KernelVocab.h"
#include "mapp/rt/Kernels.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/PlanLimits.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

using namespace mapp::rt;

const char *mapp::rt::valueKindName(ValueKind k) {
  switch (k) {
  case ValueKind::Temp:
    return "Temp";
  case ValueKind::Param:
    return "Param";
  case ValueKind::Grad:
    return "Grad";
  case ValueKind::OptState:
    return "OptState";
  case ValueKind::Input:
    return "Input";
  case ValueKind::Loss:
    return "Loss";
  }
  return "?";
}

const char *mapp::rt::blockKindName(BlockKind k) {
  switch (k) {
  case BlockKind::Forward:
    return "Forward";
  case BlockKind::Backward:
    return "Backward";
  case BlockKind::BackwardInput:
    return "BackwardInput";
  case BlockKind::BackwardWeight:
    return "BackwardWeight";
  case BlockKind::Optimizer:
    return "Optimizer";
  }
  return "?";
}

namespace {

// The compiler refuses the same (mapp/rt/PlanLimits.h).
constexpr uint64_t kMaxBytes = kMaxTensorBytes;

void verifyValue(const Program &p, size_t vi, const std::string &where) {
  const Value &v = p.values[vi];
  std::string at =
      where + ": value " + std::to_string(vi) + " ('" + v.name + "')";
  if (static_cast<uint8_t>(v.kind) > static_cast<uint8_t>(ValueKind::Loss))
    fail(at, ": unknown kind ", static_cast<int>(v.kind));
  if (static_cast<uint8_t>(v.type.dtype) > static_cast<uint8_t>(DType::I64))
    fail(at, ": unknown dtype ", static_cast<int>(v.type.dtype));
  uint64_t n = 1;
  for (int64_t d : v.type.shape) {
    if (d < 0)
      fail(at, ": negative dimension in shape ", shapeStr(v.type.shape));
    if (d > 0 && n > kMaxBytes / static_cast<uint64_t>(d))
      fail(at, ": shape ", shapeStr(v.type.shape), " is too large");
    n *= static_cast<uint64_t>(d);
  }
  if (v.storedBf16 &&
      (v.kind != ValueKind::Temp || v.type.dtype != DType::F32 ||
       v.type.shape.size() < 2))
    fail(at, ": storage_bf16 is only for an f32 Temp of rank >= 2, not a ",
         valueKindName(v.kind), " ", dtypeName(v.type.dtype),
         shapeStr(v.type.shape));
  uint64_t want = n * (v.storedBf16 ? 2 : dtypeSize(v.type.dtype));
  if (want > kMaxBytes)
    fail(at, ": shape ", shapeStr(v.type.shape), " is too large");
  if (v.bytes != want)
    fail(at, ": bytes = ", v.bytes, " but ", dtypeName(v.type.dtype),
         shapeStr(v.type.shape), v.storedBf16 ? " stored as bf16" : "",
         " needs ", want);
  // Kernels access elements through typed pointers: an offset that is not a
  // multiple of the element size is undefined behaviour (found by
  // mapp-fuzz-plan under UBSan).
  if (v.offset % dtypeSize(v.type.dtype) != 0)
    fail(at, ": offset ", v.offset, " is not a multiple of the ",
         dtypeName(v.type.dtype), " element size ", dtypeSize(v.type.dtype));
  uint64_t limit = inArena(v.kind) ? p.arenaBytes : p.persistentBytes;
  const char *space = inArena(v.kind) ? "arena_bytes" : "persistent_bytes";
  if (v.offset > limit || v.bytes > limit - v.offset)
    fail(at, ": offset ", v.offset, " + bytes ", v.bytes, " exceeds ", space,
         " = ", limit);
  if (v.shardDim != -1) {
    if (v.kind != ValueKind::Param)
      fail(at, ": only a Param may be sharded (shard_dim ", v.shardDim, ")");
    if (v.shardDim < 0 || v.shardDim >= static_cast<int>(v.type.shape.size()))
      fail(at, ": shard_dim ", v.shardDim, " out of range for shape ",
           shapeStr(v.type.shape));
    if (v.shardGroup != "tp" && v.shardGroup != "dp" && v.shardGroup != "ep")
      fail(at, ": shard_group must be \"tp\", \"dp\" or \"ep\", got '",
           v.shardGroup, "'");
    if (v.shardBlocks < 1 || v.type.shape[v.shardDim] % v.shardBlocks)
      fail(at, ": shard_blocks ", v.shardBlocks, " does not divide dim ",
           v.shardDim, " of ", shapeStr(v.type.shape));
  }
  // The executor initializes, loads, saves and norms these as float arrays
  // (numel * 4 bytes): a bf16 Param would be written past its storage.
  if ((v.kind == ValueKind::Param || v.kind == ValueKind::Grad ||
       v.kind == ValueKind::OptState) &&
      v.type.dtype != DType::F32)
    fail(at, ": a ", valueKindName(v.kind), " must be f32, got ",
         dtypeName(v.type.dtype));
  if (v.kind == ValueKind::Grad || v.kind == ValueKind::OptState) {
    if (v.param < 0 || static_cast<size_t>(v.param) >= p.values.size())
      fail(at, ": param ", v.param, " out of range (program has ",
           p.values.size(), " values)");
    const Value &owner = p.values[v.param];
    if (owner.kind != ValueKind::Param)
      fail(at, ": param ", v.param, " ('", owner.name, "') is not a Param");
    if (owner.type.shape != v.type.shape)
      fail(at, ": shape ", shapeStr(v.type.shape), " differs from param '",
           owner.name, "' ", shapeStr(owner.type.shape));
  }
}

// Kind rules for operands that are read-modify-write.
void wantKind(const Program &p, int vi, ValueKind k, const std::string &at,
              const char *what) {
  if (p.values[vi].kind != k)
    fail(at, ": ", what, " ", vi, " ('", p.values[vi].name, "') must be ",
         valueKindName(k), ", is ", valueKindName(p.values[vi].kind));
}

void verifyInstr(const Program &p, const Instr &in, const std::string &at) {
  const KernelSpec *spec = findKernelSpec(in.kernel);
  if (!spec)
    fail(at, ": unknown kernel '", in.kernel, "'");
  std::vector<TensorType> ti, to;
  for (size_t i = 0; i < in.inputs.size(); ++i) {
    int v = in.inputs[i];
    if (v < 0 || static_cast<size_t>(v) >= p.values.size())
      fail(at, ": input ", v, " out of range (program has ", p.values.size(),
           " values)");
    ti.push_back(p.values[v].type);
  }
  for (int v : in.outputs) {
    if (v < 0 || static_cast<size_t>(v) >= p.values.size())
      fail(at, ": output ", v, " out of range (program has ", p.values.size(),
           " values)");
    ValueKind k = p.values[v].kind;
    if (k == ValueKind::Param || k == ValueKind::OptState)
      fail(at, ": output ", v, " ('", p.values[v].name, "') is a ",
           valueKindName(k), "; only optimizers update those, in place");
    to.push_back(p.values[v].type);
  }
  try {
    checkKernelCall(*spec, in.attrs, ti, to);
  } catch (const Error &e) {
    fail(at, ": ", e.what());
  }
  if (in.kernel == MAPP_KERNEL_NAME(grad_accumulate))
    wantKind(p, in.outputs[0], ValueKind::Grad, at, "output");
  if (in.kernel == MAPP_KERNEL_NAME(adamw) ||
      in.kernel == MAPP_KERNEL_NAME(sgd)) {
    wantKind(p, in.inputs[0], ValueKind::Param, at, "input");
    wantKind(p, in.inputs[1], ValueKind::Grad, at, "input");
    size_t states = in.kernel == MAPP_KERNEL_NAME(adamw) ? 2 : 1;
    for (size_t i = 2; i < 2 + states; ++i)
      wantKind(p, in.inputs[i], ValueKind::OptState, at, "input");
  }
  // An output sharing bytes with an operand of the same instruction lets a
  // kernel read what it already overwrote (embedding_grad then indexed the
  // table with a clobbered id and wrote out of bounds; found by
  // mapp-fuzz-plan). The compiler's memory plan never does this: an op's
  // results and operands are live at the same point. Exception: kernels
  // that update their operand in place (grad_sync, grad_accumulate, ...) and
  // all_reduce may write exactly the storage they read (the data-parallel
  // gradient all-reduce does).
  auto overlap = [&](int a, int b) {
    const Value &x = p.values[a], &y = p.values[b];
    return inArena(x.kind) == inArena(y.kind) && x.bytes && y.bytes &&
           x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
  };
  bool inPlaceOk = spec->inPlace || in.kernel == MAPP_KERNEL_NAME(all_reduce);
  auto sameStorage = [&](int a, int b) {
    const Value &x = p.values[a], &y = p.values[b];
    return inArena(x.kind) == inArena(y.kind) && x.offset == y.offset &&
           x.bytes == y.bytes;
  };
  // A reshape marked `alias` is a view the compiler proved safe: the runtime
  // skips its copy, so its output must be exactly its input's storage (a
  // partial overlap or different bytes would hand later readers stale or
  // foreign data).
  bool alias = false;
  try {
    alias = in.attrs.getInt("alias", 0) != 0;
  } catch (const Error &e) {
    fail(at, ": ", e.what());
  }
  if (in.attrs.has("alias") && in.kernel != "reshape")
    fail(at, ": only a reshape may be an alias");
  if (alias) {
    int iv = in.inputs[0], ov = in.outputs[0];
    const Value &x = p.values[iv], &y = p.values[ov];
    if (!sameStorage(iv, ov))
      fail(at, ": alias output ", ov, " ('", y.name, "') at ",
           inArena(y.kind) ? "arena" : "pool", " offset ", y.offset, " + ",
           y.bytes, " bytes is not the storage of input ", iv, " ('", x.name,
           "') at ", inArena(x.kind) ? "arena" : "pool", " offset ", x.offset,
           " + ", x.bytes, " bytes");
    return;
  }
  for (size_t o = 0; o < in.outputs.size(); ++o) {
    int ov = in.outputs[o];
    for (int iv : in.inputs) {
      // Updating one buffer in place (grad_sync over gradient buffers, an
      // all_reduce of a value into itself) reads each element before
      // writing it; only partial overlaps between different storage are bad.
      if (inPlaceOk && sameStorage(ov, iv))
        continue;
      if (overlap(ov, iv))
        fail(at, ": output ", ov, " ('", p.values[ov].name,
             "') shares storage with input ", iv, " ('", p.values[iv].name,
             "')");
    }
    for (size_t o2 = o + 1; o2 < in.outputs.size(); ++o2)
      if (overlap(ov, in.outputs[o2]))
        fail(at, ": outputs ", ov, " and ", in.outputs[o2], " share storage");
  }
}

/// MegaDPP's alternative orders (plan.fbs ScheduleTable): each names an
/// existing block and microbatch in every task and runs exactly the tasks
/// of Program.tasks, so a scheduler switching tables neither skips nor
/// repeats work.
void verifyScheduleTables(const Plan &plan, const Program &p,
                          const std::string &where) {
  if (p.stashBytes > p.arenaBytes)
    fail(where, ": stash_bytes ", p.stashBytes, " exceeds arena_bytes ",
         p.arenaBytes, " (the stash lives in the arena slot)");
  bool adaptive = plan.schedule == "adaptive";
  if (!adaptive && !p.scheduleTables.empty())
    fail(where, ": schedule_tables are for adaptive plans, but the schedule "
         "is '", plan.schedule, "'");
  if (adaptive)
    for (const char *name : {"dfc", "bfc"}) {
      bool found = false;
      for (const ScheduleTable &t : p.scheduleTables)
        found |= t.name == name;
      if (!found)
        fail(where, ": adaptive plan has no '", name, "' schedule table");
    }
  auto key = [](const Task &t) {
    return (int64_t(t.block) << 32) | uint32_t(t.microbatch);
  };
  std::vector<int64_t> want;
  for (const Task &t : p.tasks)
    want.push_back(key(t));
  std::sort(want.begin(), want.end());
  for (size_t i = 0; i < p.scheduleTables.size(); ++i) {
    const ScheduleTable &table = p.scheduleTables[i];
    std::string at = where + ": schedule table '" + table.name + "'";
    if (table.name != "dfc" && table.name != "bfc")
      fail(at, ": unknown name (expected dfc or bfc)");
    for (size_t j = 0; j < i; ++j)
      if (p.scheduleTables[j].name == table.name)
        fail(at, " appears twice");
    for (size_t t = 0; t < table.tasks.size(); ++t) {
      const Task &task = table.tasks[t];
      if (task.block < 0 || static_cast<size_t>(task.block) >= p.blocks.size())
        fail(at, ": task ", t, " names block ", task.block,
             ", which does not exist (program has ", p.blocks.size(),
             " blocks)");
      if (task.microbatch < 0 || task.microbatch >= plan.numMicrobatches)
        fail(at, ": task ", t, ": microbatch ", task.microbatch,
             " out of range (num_microbatches ", plan.numMicrobatches, ")");
    }
    std::vector<int64_t> got;
    for (const Task &t : table.tasks)
      got.push_back(key(t));
    std::sort(got.begin(), got.end());
    if (got == want)
      continue;
    // Name the first task whose count differs.
    size_t a = 0, b = 0;
    while (a < want.size() && b < got.size() && want[a] == got[b])
      ++a, ++b;
    int64_t k = a < want.size() && (b >= got.size() || want[a] < got[b])
                    ? want[a]
                    : got[b];
    auto count = [&](const std::vector<int64_t> &v) {
      return std::count(v.begin(), v.end(), k);
    };
    fail(at, " is not a permutation of the program's tasks: (block ",
         int(k >> 32), ", microbatch ", int(uint32_t(k)), ") appears ",
         count(got), " time(s), ", count(want), " in tasks");
  }
}

/// The static executor keeps microbatch mb's activations in arena slot
/// mb mod slots from its first task in Program.tasks to its last: two
/// microbatches in flight at once must not share a slot, or the later one's
/// forward overwrites what the earlier one's backward still reads.
void verifySlots(const Program &p, const std::string &where) {
  std::map<int, std::pair<size_t, size_t>> life; // mb -> first, last task
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    const Task &t = p.tasks[i];
    if (p.blocks[t.block].kind == BlockKind::Optimizer)
      continue;
    auto [it, fresh] = life.try_emplace(t.microbatch, i, i);
    if (!fresh)
      it->second.second = i;
  }
  std::map<int, std::pair<int, size_t>> holder; // slot -> mb, its last task
  for (size_t i = 0; i < p.tasks.size(); ++i) {
    const Task &t = p.tasks[i];
    auto span = life.find(t.microbatch);
    if (span == life.end() || span->second.first != i)
      continue;
    int slot = t.microbatch % p.slots;
    auto held = holder.find(slot);
    if (held != holder.end() && held->second.second > i)
      fail(where, ": microbatches ", held->second.first, " and ",
           t.microbatch, " share arena slot ", slot, " (slots = ", p.slots,
           ") while both are in flight (task ", i, " starts ", t.microbatch,
           " before task ", held->second.second, " ends ",
           held->second.first, "): the plan needs more slots");
    holder[slot] = {t.microbatch, span->second.second};
  }
}

void verifyProgram(const Plan &plan, const Program &p, size_t pi) {
  std::string where = "plan: program " + std::to_string(pi);
  if (p.rank < 0 || p.rank >= plan.worldSize)
    fail(where, ": rank ", p.rank, " out of range (world_size ", plan.worldSize,
         ")");
  if (p.slots < 1 || p.slots > 4096)
    fail(where, ": slots = ", p.slots, " (must be 1..4096)");
  if (p.arenaBytes > kMaxBytes || p.persistentBytes > kMaxBytes)
    fail(where, ": arena_bytes/persistent_bytes too large");
  for (size_t v = 0; v < p.values.size(); ++v)
    verifyValue(p, v, where);
  for (size_t b = 0; b < p.blocks.size(); ++b) {
    const Block &blk = p.blocks[b];
    if (static_cast<uint8_t>(blk.kind) >
        static_cast<uint8_t>(BlockKind::Optimizer))
      fail(where, ": block ", b, " has unknown kind ",
           static_cast<int>(blk.kind));
    for (size_t i = 0; i < blk.instrs.size(); ++i) {
      const Instr &in = blk.instrs[i];
      verifyInstr(p, in,
                  "plan: instr " + std::to_string(i) + " (" + in.kernel +
                      ") in block " + std::to_string(b) +
                      (plan.programs.size() > 1
                           ? " of program " + std::to_string(pi)
                           : std::string()));
    }
  }
  for (size_t t = 0; t < p.tasks.size(); ++t) {
    const Task &task = p.tasks[t];
    if (task.block < 0 || static_cast<size_t>(task.block) >= p.blocks.size())
      fail(where, ": task ", t, ": block ", task.block,
           " out of range (program has ", p.blocks.size(), " blocks)");
    if (task.microbatch < 0 || task.microbatch >= plan.numMicrobatches)
      fail(where, ": task ", t, ": microbatch ", task.microbatch,
           " out of range (num_microbatches ", plan.numMicrobatches, ")");
  }
  verifySlots(p, where);
  verifyScheduleTables(plan, p, where);
  auto checkSpecial = [&](int v, const char *what, ValueKind kind,
                          const Shape &shape, DType dt) {
    if (v == -1)
      return;
    if (v < 0 || static_cast<size_t>(v) >= p.values.size())
      fail(where, ": ", what, " ", v, " out of range (program has ",
           p.values.size(), " values)");
    const Value &val = p.values[v];
    if (val.kind != kind || val.type.dtype != dt || val.type.shape != shape)
      fail(where, ": ", what, " value ", v, " ('", val.name, "') must be ",
           valueKindName(kind), " ", dtypeName(dt), shapeStr(shape), ", is ",
           valueKindName(val.kind), " ", dtypeName(val.type.dtype),
           shapeStr(val.type.shape));
  };
  Shape bt = {plan.microBatchSize, plan.seqLength};
  checkSpecial(p.tokens, "tokens", ValueKind::Input, bt, DType::I32);
  checkSpecial(p.targets, "targets", ValueKind::Input, bt, DType::I32);
  checkSpecial(p.loss, "loss", ValueKind::Loss, {}, DType::F32);
}

/// The layout checks: the executor sets the communicator's layout from
/// these fields and indexes programs by rank without looking again.
void verifyLayout(const Plan &plan) {
  // MegaFBD (docs/megafbd.md): forward-side programs ("fwd") follow the
  // backward side's ranks in a layout of their own tp (Placement.tp).
  bool split = false;
  int fwdTp = 0;
  for (const Program &p : plan.programs) {
    const Placement &pl = p.placement;
    if (!pl.role.empty() && pl.role != "fwd" && pl.role != "bwd")
      fail("plan: program of rank ", p.rank, " has placement role '", pl.role,
           "' (\"\", fwd or bwd)");
    split |= !pl.role.empty();
    if (pl.peerRank < -1 || pl.peerRank >= plan.worldSize)
      fail("plan: program of rank ", p.rank, " names peer rank ", pl.peerRank,
           " outside the world of ", plan.worldSize);
    if (pl.role == "fwd") {
      if (fwdTp && fwdTp != pl.tp)
        fail("plan: forward programs disagree on their tp (", fwdTp, " and ",
             pl.tp, ")");
      fwdTp = pl.tp;
    }
  }
  if (split && fwdTp == 0 &&
      std::none_of(plan.programs.begin(), plan.programs.end(),
                   [](const Program &p) { return p.placement.role == "fwd"; }))
    fail("plan: a split (MegaFBD) plan without forward programs");
  if (split && fwdTp < 1)
    fail("plan: forward programs have placement tp ", fwdTp, " (must be >= 1)");
  // Products in 64 bits: tp/dp/pp are each >= 1 but unbounded by the file.
  int64_t side = int64_t(plan.tp) * plan.dp * plan.pp;
  int64_t fwdSide = split ? int64_t(fwdTp) * plan.dp * plan.pp : 0;
  if (side + fwdSide != plan.worldSize)
    fail("plan: tp ", plan.tp, " x dp ", plan.dp, " x pp ", plan.pp,
         split ? " + the forward side's ranks" : "", " != world_size ",
         plan.worldSize);
  std::vector<bool> has(plan.worldSize, false);
  for (const Program &p : plan.programs)
    has[p.rank] = true; // in range and unique: verifyPlan checked
  for (int r = 0; r < plan.worldSize; ++r)
    if (!has[r])
      fail("plan: no program for rank ", r, " (world_size ", plan.worldSize,
           ", ", plan.programs.size(), " program(s))");
  if (plan.worldSize == 1)
    return; // a lone program's coordinates are not read
  for (const Program &p : plan.programs) {
    bool fwd = p.placement.role == "fwd";
    // Megatron order within the side: rank = tp + TP*(dp + DP*pp).
    int64_t tp = fwd ? fwdTp : plan.tp;
    int64_t r = fwd ? p.rank - side : p.rank;
    if (r < 0 || r >= (fwd ? fwdSide : side))
      fail("plan: program of rank ", p.rank, " is a ",
           fwd ? "forward" : "backward", "-side program outside its side's "
           "ranks [", fwd ? side : 0, ", ", fwd ? side + fwdSide : side, ")");
    int64_t wantTp = r % tp, wantDp = (r / tp) % plan.dp,
            wantPp = r / (tp * plan.dp);
    if (p.tp != wantTp || p.dp != wantDp || p.pp != wantPp)
      fail("plan: program of rank ", p.rank, " has coordinates (dp ", p.dp,
           ", pp ", p.pp, ", tp ", p.tp, "), Megatron order gives (dp ",
           wantDp, ", pp ", wantPp, ", tp ", wantTp, ")");
  }
}

} // namespace

bool mapp::rt::isFbdPlan(const Plan &plan) {
  for (const Program &p : plan.programs)
    if (!p.placement.role.empty())
      return true;
  return false;
}

void mapp::rt::verifyPlan(const Plan &plan) {
  if (plan.version != kPlanSchemaVersion)
    fail("plan: schema version ", plan.version, " but this runtime reads ",
         kPlanSchemaVersion);
  if (plan.worldSize < 1 || plan.worldSize > kMaxWorldSize)
    fail("plan: world_size = ", plan.worldSize, " (must be 1..", kMaxWorldSize,
         ")");
  if (plan.tp < 1 || plan.pp < 1 || plan.dp < 1 || plan.chunks < 1)
    fail("plan: tp/pp/dp/chunks must be >= 1 (got ", plan.tp, "/", plan.pp, "/",
         plan.dp, "/", plan.chunks, ")");
  if (plan.ep < 0 || (plan.ep > 0 && plan.dp % plan.ep))
    fail("plan: ep ", plan.ep, " must divide dp ", plan.dp,
         " (expert parallelism lives inside the data-parallel group)");
  if (plan.cp < 0 || (plan.cp > 0 && plan.dp % plan.cp))
    fail("plan: cp ", plan.cp, " must divide dp ", plan.dp,
         " (context parallelism lives inside the data-parallel group)");
  if (plan.cp > 1 && plan.ep > 1)
    fail("plan: cp ", plan.cp, " and ep ", plan.ep,
         " together are not supported (both live inside dp)");
  if (plan.microBatchSize < 1 || plan.seqLength < 1 || plan.vocabSize < 1)
    fail("plan: micro_batch_size, seq_length and vocab_size must be >= 1 (got ",
         plan.microBatchSize, ", ", plan.seqLength, ", ", plan.vocabSize, ")");
  // Bounds the executor's per-microbatch bookkeeping (found by
  // mapp-fuzz-plan: 2^31 microbatches made every step allocate 16 GiB) and
  // keeps micro_batch_size * seq_length, used as an int, from overflowing.
  if (plan.numMicrobatches < 1 || plan.numMicrobatches > kMaxMicrobatches)
    fail("plan: num_microbatches = ", plan.numMicrobatches, " (must be 1..",
         kMaxMicrobatches, ")");
  if (int64_t(plan.microBatchSize) * plan.seqLength > kMaxTokensPerMicrobatch)
    fail("plan: micro_batch_size x seq_length = ",
         int64_t(plan.microBatchSize) * plan.seqLength, " is too large");
  if (!(plan.maxGradNorm >= 0))
    fail("plan: max_grad_norm = ", plan.maxGradNorm, " (must be >= 0)");
  if (plan.programs.empty())
    fail("plan: no programs");
  if (plan.schedule == "adaptive") {
    const AdaptivePolicy &a = plan.adaptive;
    if (!(a.slowLinkRatio > 1))
      fail("plan: adaptive slow_link_ratio = ", a.slowLinkRatio,
           " (must be > 1)");
    if (!(a.bandwidthSmoothing > 0 && a.bandwidthSmoothing <= 1))
      fail("plan: adaptive bandwidth_smoothing = ", a.bandwidthSmoothing,
           " (must be in (0, 1])");
  }
  for (size_t i = 0; i < plan.programs.size(); ++i)
    verifyProgram(plan, plan.programs[i], i);
  // One program per rank: the executor would silently pick one of several.
  for (size_t i = 0; i < plan.programs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (plan.programs[i].rank == plan.programs[j].rank)
        fail("plan: programs ", j, " and ", i, " are both for rank ",
             plan.programs[i].rank);
  verifyLayout(plan);
}

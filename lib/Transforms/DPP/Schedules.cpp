// Generators of the standard pipeline schedules (task tables per rank).
#include "mapp/Transforms/Schedules.h"
#include "mapp/rt/PlanLimits.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

#include <tuple>

using namespace mlir;
using namespace mapp;
using namespace mapp::sched;

static Task fwd(int64_t c, int64_t m) { return {TaskKind::Forward, c, m}; }
static Task bwd(int64_t c, int64_t m) { return {TaskKind::Backward, c, m}; }

/// GPipe: all forwards, then all backwards (microbatches in order).
static void gpipe(Schedule &s) {
  for (auto &table : s.ranks) {
    for (int64_t m = 0; m < s.microbatches; ++m)
      table.push_back(fwd(0, m));
    for (int64_t m = 0; m < s.microbatches; ++m)
      table.push_back(bwd(0, m));
  }
}

/// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): rank r runs
/// min(p − r − 1, m) warm-up forwards, then alternates one forward and one
/// backward, then drains the remaining backwards.
static void oneFOneB(Schedule &s) {
  int64_t p = s.stages, m = s.microbatches;
  for (int64_t r = 0; r < p; ++r) {
    auto &table = s.ranks[r];
    int64_t warmup = std::min(p - r - 1, m);
    for (int64_t i = 0; i < warmup; ++i)
      table.push_back(fwd(0, i));
    for (int64_t i = 0; i < m - warmup; ++i) {
      table.push_back(fwd(0, warmup + i));
      table.push_back(bwd(0, i));
    }
    for (int64_t i = m - warmup; i < m; ++i)
      table.push_back(bwd(0, i));
  }
}

static Task bwdInput(int64_t m) { return {TaskKind::BackwardInput, 0, m}; }
static Task bwdWeight(int64_t m) { return {TaskKind::BackwardWeight, 0, m}; }

/// Megatron's interleaved 1F1B
/// (megatron/core/pipeline_parallel/schedules.py,
/// forward_backward_pipelining_with_interleaving and get_schedule_table)
/// with microbatch_group_size_per_vp_stage = N: forwards walk groups of N
/// microbatches, each group through chunk 0 … v − 1; the k-th backward
/// runs the k-th forward's (chunk, microbatch) with the chunk reversed.
/// Warm-up: 2(p − r − 1) + (v − 1)·N forwards, capped at m·v. N = p is the
/// depth-first extreme (DFC, Megatron's default), N = m the breadth-first
/// one (BFC: every microbatch through a chunk before the next chunk, the
/// order of PyTorch's ScheduleLoopedBFS, with the 1F1B steady state).
static void interleaved(Schedule &s, int64_t group) {
  int64_t p = s.stages, v = s.chunks, m = s.microbatches, total = m * v;
  std::vector<std::pair<int64_t, int64_t>> order; // (chunk, microbatch)
  for (int64_t lo = 0; lo < m; lo += group)
    for (int64_t c = 0; c < v; ++c)
      for (int64_t mb = lo; mb < std::min(lo + group, m); ++mb)
        order.push_back({c, mb});
  auto f = [&](int64_t k) { return fwd(order[k].first, order[k].second); };
  auto b = [&](int64_t k) {
    return bwd(v - 1 - order[k].first, order[k].second);
  };
  for (int64_t r = 0; r < p; ++r) {
    auto &table = s.ranks[r];
    int64_t warmup = std::min(2 * (p - r - 1) + (v - 1) * group, total);
    for (int64_t k = 0; k < warmup; ++k)
      table.push_back(f(k));
    for (int64_t i = 0; i < total - warmup; ++i) {
      table.push_back(f(warmup + i));
      table.push_back(b(i));
    }
    for (int64_t i = total - warmup; i < total; ++i)
      table.push_back(b(i));
  }
}

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with
/// the backward split into the input gradient Bi (on the critical path to
/// the previous stage) and the weight gradient W (local). Rank r defers up
/// to r weight gradients and runs them once more are pending, the rest at
/// the end: the later ranks' W fill the cool-down bubbles, which shrink
/// from (p − 1)(F + B) to (p − 1)(F + Bi − W) with B = Bi + W, while no
/// rank holds more than p microbatches (1F1B's peak on rank 0).
static void zeroBubbleH1(Schedule &s) {
  int64_t p = s.stages, m = s.microbatches;
  for (int64_t r = 0; r < p; ++r) {
    auto &table = s.ranks[r];
    int64_t warmup = std::min(p - r - 1, m), next = 0;
    auto backward = [&](int64_t i) {
      table.push_back(bwdInput(i));
      while (i + 1 - next > r)
        table.push_back(bwdWeight(next++));
    };
    for (int64_t i = 0; i < warmup; ++i)
      table.push_back(fwd(0, i));
    for (int64_t i = 0; i < m - warmup; ++i) {
      table.push_back(fwd(0, warmup + i));
      backward(i);
    }
    for (int64_t i = m - warmup; i < m; ++i)
      backward(i);
    while (next < m)
      table.push_back(bwdWeight(next++));
  }
}

static std::string str(int64_t x) { return std::to_string(x); }

bool sched::generate(StringRef kind, int64_t stages, int64_t chunks,
                     int64_t microbatches, Schedule &out, std::string &error,
                     int64_t group) {
  if (stages < 1 || chunks < 1 || microbatches < 1) {
    error = "stages, chunks and microbatches must be >= 1";
    return false;
  }
  // Bounded before the tables (two tasks per microbatch and stage) are
  // built: microbatches=10^9 ran out of memory after two minutes.
  const std::tuple<const char *, int64_t, int64_t> bounds[] = {
      {"microbatches", microbatches, rt::kMaxMicrobatches},
      {"stages", stages, rt::kMaxWorldSize},
      {"chunks", chunks, rt::kMaxLayers}};
  for (auto [name, value, limit] : bounds)
    if (value > limit) {
      error = std::string(name) + "=" + str(value) + " is more than " +
              str(limit) + " (the most a plan may have)";
      return false;
    }
  if (stages * chunks * microbatches > rt::kMaxScheduleSlots) {
    error = "stages x chunks x microbatches = " +
            str(stages * chunks * microbatches) + " is more than " +
            str(rt::kMaxScheduleSlots) +
            " (the task tables hold two tasks for each)";
    return false;
  }
  if (group < 0) {
    error = "group must be >= 0 (0: the default of the schedule), got " +
            str(group);
    return false;
  }
  out = Schedule();
  out.kind = kind.str();
  out.stages = stages;
  out.chunks = chunks;
  out.microbatches = microbatches;
  out.ranks.assign(stages, {});
  int64_t p = stages, m = microbatches;
  bool grouped = kind == "interleaved" || kind == "dfc" || kind == "bfc";
  if (group && !grouped) {
    error = "group=" + str(group) + " applies to interleaved schedules, not '" +
            kind.str() + "'";
    return false;
  }
  if (kind == "gpipe" || kind == "1f1b" || kind == "zb-h1") {
    if (chunks != 1) {
      error = "schedule '" + kind.str() + "' runs one chunk per stage, got "
              "chunks=" + str(chunks) + " (use interleaved, dfc or bfc)";
      return false;
    }
    kind == "gpipe" ? gpipe(out) : kind == "1f1b" ? oneFOneB(out)
                                                  : zeroBubbleH1(out);
    return true;
  }
  if (!grouped) {
    error = "unknown schedule '" + kind.str() + "' (expected " +
            kScheduleKinds + ")";
    return false;
  }
  int64_t n = kind == "bfc" ? m : kind == "dfc" ? p : group ? group : p;
  if (kind == "dfc" && group && group != p) {
    error = "dfc is group=p (" + str(p) + "), got group=" + str(group);
    return false;
  }
  if (kind == "bfc" && group && group != m) {
    error = "bfc is group=m (" + str(m) + "), got group=" + str(group);
    return false;
  }
  if (group && (group < p || group > m)) {
    error = "interleaved group=" + str(group) + " is outside [p, m] = [" +
            str(p) + ", " + str(m) + "]";
    return false;
  }
  // One chunk per rank: every group size gives the 1F1B order.
  if (chunks == 1) {
    oneFOneB(out);
    return true;
  }
  if (m < p) {
    error = "schedule '" + kind.str() + "' with " + str(chunks) +
            " chunks needs at least as many microbatches (" + str(m) +
            ") as pipeline stages (" + str(p) + ")";
    return false;
  }
  if (m % n != 0) {
    error = "schedule '" + kind.str() + "' needs microbatches (" + str(m) +
            ") to be a multiple of its group N = " + str(n) +
            (n == p ? " (= p)" : "");
    return false;
  }
  interleaved(out, n);
  return true;
}

bool sched::generateAdaptive(int64_t stages, int64_t chunks,
                             int64_t microbatches, Schedule &dfc,
                             Schedule &bfc, std::string &error) {
  return generate("dfc", stages, chunks, microbatches, dfc, error) &&
         generate("bfc", stages, chunks, microbatches, bfc, error);
}

bool sched::sameTasks(const Schedule &a, const Schedule &b) {
  if (a.ranks.size() != b.ranks.size())
    return false;
  auto key = [](const Task &t) {
    return std::make_tuple((int)t.kind, t.chunk, t.microbatch);
  };
  for (auto [x, y] : llvm::zip(a.ranks, b.ranks)) {
    if (x.size() != y.size())
      return false;
    std::vector<std::tuple<int, int64_t, int64_t>> kx, ky;
    for (const Task &t : x)
      kx.push_back(key(t));
    for (const Task &t : y)
      ky.push_back(key(t));
    llvm::sort(kx);
    llvm::sort(ky);
    if (kx != ky)
      return false;
  }
  return true;
}

Schedule sched::fromOp(ScheduleOp op) {
  Schedule s;
  s.kind = op.getKind().str();
  s.chunks = op.getChunksAttr().getInt();
  s.microbatches = op.getMicrobatchesAttr().getInt();
  for (Attribute t : op.getTables()) {
    auto &table = s.ranks.emplace_back();
    for (Attribute a : cast<ArrayAttr>(t)) {
      auto task = cast<TaskAttr>(a);
      table.push_back({task.getKind(), task.getChunk(), task.getMicrobatch()});
    }
  }
  s.stages = s.ranks.size();
  return s;
}

ScheduleOp sched::toOp(OpBuilder &b, Location loc, const Schedule &s) {
  MLIRContext *ctx = b.getContext();
  SmallVector<Attribute> tables;
  for (const auto &table : s.ranks) {
    SmallVector<Attribute> tasks;
    for (const Task &t : table)
      tasks.push_back(TaskAttr::get(ctx, t.kind, t.chunk, t.microbatch));
    tables.push_back(ArrayAttr::get(ctx, tasks));
  }
  return b.create<ScheduleOp>(loc, b.getStringAttr(s.kind),
                              b.getI64IntegerAttr(s.microbatches),
                              b.getI64IntegerAttr(s.chunks),
                              b.getArrayAttr(tables));
}

// Generators of the standard pipeline schedules (task tables per rank).
#include "mapp/Transforms/Schedules.h"

#include "llvm/ADT/StringExtras.h"

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

/// Megatron's interleaved 1F1B
/// (megatron/core/pipeline_parallel/schedules.py,
/// forward_backward_pipelining_with_interleaving, with
/// microbatch_group_size_per_vp_stage = p): the k-th forward of a rank runs
/// chunk (k mod p·v) / p on microbatch (k / p·v)·p + k mod p; the k-th
/// backward runs the chunks in reverse order. Warm-up: (p − r − 1)·2 +
/// (v − 1)·p forwards, capped at m·v (Megatron-Core; older Megatron-LM
/// also ran every forward first when m = p).
static void interleaved(Schedule &s) {
  int64_t p = s.stages, v = s.chunks, m = s.microbatches, total = m * v;
  auto chunkOf = [&](int64_t k, bool forward) {
    int64_t c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto mbOf = [&](int64_t k) { return (k / (p * v)) * p + k % p; };
  for (int64_t r = 0; r < p; ++r) {
    auto &table = s.ranks[r];
    int64_t warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
    for (int64_t k = 0; k < warmup; ++k)
      table.push_back(fwd(chunkOf(k, true), mbOf(k)));
    for (int64_t i = 0; i < total - warmup; ++i) {
      int64_t k = warmup + i;
      table.push_back(fwd(chunkOf(k, true), mbOf(k)));
      table.push_back(bwd(chunkOf(i, false), mbOf(i)));
    }
    for (int64_t i = total - warmup; i < total; ++i)
      table.push_back(bwd(chunkOf(i, false), mbOf(i)));
  }
}

bool sched::generate(StringRef kind, int64_t stages, int64_t chunks,
                     int64_t microbatches, Schedule &out, std::string &error) {
  if (stages < 1 || chunks < 1 || microbatches < 1) {
    error = "stages, chunks and microbatches must be >= 1";
    return false;
  }
  out = Schedule();
  out.kind = kind.str();
  out.stages = stages;
  out.chunks = chunks;
  out.microbatches = microbatches;
  out.ranks.assign(stages, {});
  if (kind == "gpipe" || kind == "1f1b") {
    if (chunks != 1) {
      error = "schedule '" + kind.str() + "' runs one chunk per stage, got "
              "chunks=" + std::to_string(chunks) + " (use interleaved)";
      return false;
    }
    kind == "gpipe" ? gpipe(out) : oneFOneB(out);
    return true;
  }
  if (kind == "interleaved") {
    if (microbatches % stages != 0) {
      error = "interleaved schedule needs microbatches (" +
              std::to_string(microbatches) + ") to be a multiple of the "
              "pipeline stages (" + std::to_string(stages) + ")";
      return false;
    }
    interleaved(out);
    return true;
  }
  error = "unknown schedule '" + kind.str() +
          "' (expected gpipe, 1f1b or interleaved)";
  return false;
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

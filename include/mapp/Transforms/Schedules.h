//===- Schedules.h - pipeline schedule tables and their verifier -*- C++ -*-===//
//
// Pipeline schedules as per-rank task tables (the contents of a
// `mapp.schedule` op), the generators of the standard ones (GPipe, 1F1B,
// Megatron's interleaved 1F1B) and a verifier that simulates the tables.
//
// Pipeline model: with p ranks and v chunks per rank, virtual stage
// s = chunk·p + rank (Megatron's interleaved assignment). F(s, m) receives
// its input from F(s−1, m) and sends its output to F(s+1, m); B(s, m) (or
// Bi(s, m) with a split backward) receives the output gradient from
// B(s+1, m), needs F(s, m) on its own rank, and sends the input gradient to
// B(s−1, m); W(s, m) needs Bi(s, m). Sends are posted without waiting for
// the receiver (isend / buffered, tagged by microbatch); receives block.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_TRANSFORMS_SCHEDULES_H
#define MAPP_TRANSFORMS_SCHEDULES_H

#include "mapp/Dialect/Mapp/IR/MappOps.h"

#include <string>
#include <vector>

namespace mapp {
namespace sched {

struct Task {
  TaskKind kind;
  int64_t chunk;
  int64_t microbatch;
};

/// Per-rank task tables of one training step.
struct Schedule {
  std::string kind;
  int64_t stages = 1;
  int64_t chunks = 1;
  int64_t microbatches = 1;
  std::vector<std::vector<Task>> ranks;
};

/// Builds a standard schedule: "gpipe", "1f1b" or "interleaved" (chunks > 1
/// allowed only for interleaved; it needs microbatches % stages == 0).
/// Returns false with a message in `error` for invalid parameters.
bool generate(llvm::StringRef kind, int64_t stages, int64_t chunks,
              int64_t microbatches, Schedule &out, std::string &error);

/// Reads a `mapp.schedule` op's tables.
Schedule fromOp(ScheduleOp op);
/// Builds a `mapp.schedule` op at the builder's insertion point.
ScheduleOp toOp(mlir::OpBuilder &b, mlir::Location loc, const Schedule &s);

/// What the simulation of a valid schedule measured.
struct Stats {
  double makespan = 0;  // time of the last task end
  double bubble = 0;    // idle fraction: 1 − busy / (ranks · makespan)
  /// Per rank: forwards run before its first backward (1F1B: the
  /// min(p − r − 1, m) warm-up forwards plus the first steady one).
  std::vector<int64_t> warmupForwards;
  std::vector<int64_t> peakInFlight;   // per rank: max forwards awaiting their backward
};

/// Task durations for the simulation (per chunk, i.e. per virtual stage).
struct Costs {
  double forward = 1, backward = 2, backwardInput = 1, backwardWeight = 1;
};

/// Checks that every rank runs each (kind, chunk, microbatch) exactly once,
/// that local dependencies hold (B after F, W after Bi), and simulates the
/// tables with the given costs: a rank waiting on a receive that can never
/// be matched is a deadlock, reported naming every stuck rank and task.
/// Returns false with a message in `error`.
bool verify(const Schedule &s, const Costs &costs, Stats &stats,
            std::string &error);

std::string taskStr(const Task &t);

} // namespace sched
} // namespace mapp

#endif // MAPP_TRANSFORMS_SCHEDULES_H

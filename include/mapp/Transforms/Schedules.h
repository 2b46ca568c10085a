//===- Schedules.h - pipeline schedule tables and their verifier -*- C++ -*-===//
//
// Pipeline schedules as per-rank task tables (the contents of a
// `mapp.schedule` op), the generators of the standard ones (GPipe, 1F1B,
// Megatron's interleaved 1F1B with any microbatch group N, its depth-first
// (N = p) and breadth-first (N = m) extremes, ZB-H1) and a verifier that
// simulates the tables.
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

/// The schedules `generate` knows, for messages.
constexpr const char *kScheduleKinds = "gpipe, 1f1b, interleaved, dfc, bfc, "
                                       "zb-h1 or adaptive";

/// Builds a standard schedule:
///  * "gpipe", "1f1b", "zb-h1" (one chunk per stage);
///  * "interleaved" with microbatch group `group` (0: p), p <= N <= m and
///    m % N == 0 when chunks > 1 (Megatron's
///    microbatch_group_size_per_vp_stage); "dfc" is N = p, "bfc" N = m.
///    With one chunk these are 1F1B.
/// Returns false with a message naming the violated constraint in `error`.
/// ("adaptive" is a pair of tables: see generateAdaptive.)
bool generate(llvm::StringRef kind, int64_t stages, int64_t chunks,
              int64_t microbatches, Schedule &out, std::string &error,
              int64_t group = 0);

/// The two tables of an adaptive schedule: depth-first ("dfc", the static
/// fallback) and breadth-first ("bfc"), same tasks in another order.
bool generateAdaptive(int64_t stages, int64_t chunks, int64_t microbatches,
                      Schedule &dfc, Schedule &bfc, std::string &error);

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
  /// Per rank: idle fraction of the makespan, 1 − busy_r / makespan.
  std::vector<double> rankBubble;
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

/// Whether two schedules run the same multiset of tasks on every rank.
bool sameTasks(const Schedule &a, const Schedule &b);

} // namespace sched
} // namespace mapp

#endif // MAPP_TRANSFORMS_SCHEDULES_H

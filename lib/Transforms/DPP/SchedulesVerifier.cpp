// The schedule verifier: completeness, local dependencies, and a simulation
// of all ranks' tables that finds deadlocks and measures the bubble.
#include "mapp/Transforms/Schedules.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <tuple>

using namespace mlir;
using namespace mapp;
using namespace mapp::sched;

std::string sched::taskStr(const Task &t) {
  const char *k = t.kind == TaskKind::Forward          ? "F"
                  : t.kind == TaskKind::Backward       ? "B"
                  : t.kind == TaskKind::BackwardInput  ? "Bi"
                                                       : "W";
  return std::string(k) + "(chunk " + std::to_string(t.chunk) + ", mb " +
         std::to_string(t.microbatch) + ")";
}

namespace {
using Key = std::tuple<int, int64_t, int64_t>; // kind, chunk, microbatch
Key keyOf(TaskKind k, int64_t c, int64_t m) { return {(int)k, c, m}; }
bool isBackward(TaskKind k) {
  return k == TaskKind::Backward || k == TaskKind::BackwardInput;
}
} // namespace

/// Completeness and per-rank order of dependent tasks.
static bool checkTables(const Schedule &s, bool &split, std::string &error) {
  llvm::raw_string_ostream os(error);
  if (s.stages < 1 || (int64_t)s.ranks.size() != s.stages) {
    os << "schedule has " << s.ranks.size() << " tables for " << s.stages
       << " stages";
    return false;
  }
  split = false;
  bool fused = false;
  for (const auto &table : s.ranks)
    for (const Task &t : table) {
      split |= t.kind == TaskKind::BackwardInput ||
               t.kind == TaskKind::BackwardWeight;
      fused |= t.kind == TaskKind::Backward;
    }
  if (split && fused) {
    os << "schedule mixes fused (B) and split (Bi/W) backward tasks";
    return false;
  }
  SmallVector<TaskKind> kinds{TaskKind::Forward};
  if (split)
    kinds.append({TaskKind::BackwardInput, TaskKind::BackwardWeight});
  else
    kinds.push_back(TaskKind::Backward);

  for (auto [r, table] : llvm::enumerate(s.ranks)) {
    std::map<Key, size_t> pos;
    for (auto [i, t] : llvm::enumerate(table)) {
      if (t.chunk < 0 || t.chunk >= s.chunks || t.microbatch < 0 ||
          t.microbatch >= s.microbatches) {
        os << "rank " << r << ": task " << taskStr(t) << " is outside "
           << s.chunks << " chunk(s) x " << s.microbatches << " microbatch(es)";
        return false;
      }
      if (!pos.emplace(keyOf(t.kind, t.chunk, t.microbatch), i).second) {
        os << "rank " << r << ": task " << taskStr(t) << " appears twice";
        return false;
      }
    }
    for (int64_t c = 0; c < s.chunks; ++c)
      for (int64_t m = 0; m < s.microbatches; ++m)
        for (TaskKind k : kinds)
          if (!pos.count(keyOf(k, c, m))) {
            os << "rank " << r << " never runs " << taskStr({k, c, m});
            return false;
          }
    // A backward needs its own forward; a weight gradient its input gradient.
    for (auto [i, t] : llvm::enumerate(table)) {
      std::optional<Task> before;
      if (isBackward(t.kind))
        before = Task{TaskKind::Forward, t.chunk, t.microbatch};
      else if (t.kind == TaskKind::BackwardWeight)
        before = Task{TaskKind::BackwardInput, t.chunk, t.microbatch};
      if (before &&
          pos[keyOf(before->kind, before->chunk, before->microbatch)] > i) {
        os << "rank " << r << ": " << taskStr(t) << " (task #" << i
           << ") runs before " << taskStr(*before) << " on the same rank";
        return false;
      }
    }
  }
  return true;
}

bool sched::verify(const Schedule &s, const Costs &costs, Stats &stats,
                   std::string &error) {
  bool split;
  if (!checkTables(s, split, error))
    return false;

  const int64_t p = s.stages, last = p * s.chunks - 1;
  auto vstage = [&](int64_t rank, int64_t chunk) { return chunk * p + rank; };
  // Delivered messages: (is gradient, destination virtual stage, mb) → time.
  std::map<std::tuple<bool, int64_t, int64_t>, double> arrived;
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0), busy(p, 0);
  std::vector<int64_t> inFlight(p, 0);
  stats = Stats();
  stats.warmupForwards.assign(p, 0);
  stats.peakInFlight.assign(p, 0);
  std::vector<bool> sawBackward(p, false);

  // Sends are eager, so the times do not depend on the order in which
  // ranks are advanced: advance any rank whose next receive is satisfied.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t r = 0; r < p; ++r) {
      while (next[r] < s.ranks[r].size()) {
        const Task &t = s.ranks[r][next[r]];
        int64_t vs = vstage(r, t.chunk);
        double ready = clock[r];
        std::optional<std::tuple<bool, int64_t, int64_t>> need;
        if (t.kind == TaskKind::Forward && vs > 0)
          need = {false, vs, t.microbatch};
        else if (isBackward(t.kind) && vs < last)
          need = {true, vs, t.microbatch};
        if (need) {
          auto it = arrived.find(*need);
          if (it == arrived.end())
            break;
          ready = std::max(ready, it->second);
        }
        double dur = t.kind == TaskKind::Forward        ? costs.forward
                     : t.kind == TaskKind::Backward      ? costs.backward
                     : t.kind == TaskKind::BackwardInput ? costs.backwardInput
                                                         : costs.backwardWeight;
        clock[r] = ready + dur;
        busy[r] += dur;
        if (t.kind == TaskKind::Forward) {
          if (vs < last)
            arrived[{false, vs + 1, t.microbatch}] = clock[r];
          if (!sawBackward[r])
            ++stats.warmupForwards[r];
          stats.peakInFlight[r] = std::max(stats.peakInFlight[r], ++inFlight[r]);
        } else if (isBackward(t.kind)) {
          sawBackward[r] = true;
          if (vs > 0)
            arrived[{true, vs - 1, t.microbatch}] = clock[r];
        }
        // Activations are freed once the last backward task of a (chunk,
        // microbatch) ran: B, or W with a split backward.
        if (t.kind == TaskKind::Backward || t.kind == TaskKind::BackwardWeight)
          --inFlight[r];
        ++next[r];
        progress = true;
      }
    }
  }

  // Ranks that did not finish wait on a receive that can never complete.
  std::string stuck;
  llvm::raw_string_ostream os(stuck);
  int64_t firstStuck = -1;
  for (int64_t r = 0; r < p; ++r) {
    if (next[r] == s.ranks[r].size())
      continue;
    const Task &t = s.ranks[r][next[r]];
    int64_t vs = vstage(r, t.chunk);
    int64_t from = t.kind == TaskKind::Forward ? vs - 1 : vs + 1;
    if (firstStuck < 0)
      firstStuck = r;
    else
      os << "; ";
    os << "rank " << r << " waits at task #" << next[r] << " " << taskStr(t)
       << " for the " << (t.kind == TaskKind::Forward ? "activation" : "gradient")
       << " of virtual stage " << from << " (rank " << from % p << ", chunk "
       << from / p << ")";
  }
  if (firstStuck >= 0) {
    error = "deadlock: " + stuck;
    return false;
  }

  double total = 0;
  for (int64_t r = 0; r < p; ++r) {
    stats.makespan = std::max(stats.makespan, clock[r]);
    total += busy[r];
  }
  stats.bubble = stats.makespan > 0 ? 1.0 - total / (p * stats.makespan) : 0;
  for (int64_t r = 0; r < p; ++r)
    stats.rankBubble.push_back(
        stats.makespan > 0 ? 1.0 - busy[r] / stats.makespan : 0);
  return true;
}

//===- ExpertTally.h - tokens per expert of a step --------------*- C++ -*-===//
//
// The rows each MoE layer's moe_assign gave every expert (its `counts`
// result), summed over the step's microbatches: what metrics.jsonl reports
// as expert_tokens, so an unbalanced expert is visible (docs/moe.md). A
// recomputed forward runs moe_assign again with the same result; a
// microbatch's counts are kept once.
//
//===----------------------------------------------------------------------===//

#ifndef MAPP_RT_EXPERTTALLY_H
#define MAPP_RT_EXPERTTALLY_H

#include "mapp/rt/Tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mapp::rt {

class Backend;
class Communicator;
struct CommGroup;

/// (moe_assign name, rows per expert) in plan order.
using ExpertTokens = std::vector<std::pair<std::string, std::vector<int64_t>>>;

class ExpertTally {
public:
  /// After a moe_assign ran for microbatch `mb`: `counts` is its [E] i32
  /// result in storage (read through the backend, maybe from a device).
  void record(const std::string &instrName, int mb, const Tensor &counts,
              Backend &backend);
  /// This step's sums; resets for the next step.
  ExpertTokens take();

  /// Sums `t` over the members of `group` (each holds the same layers: the
  /// dp group), so the counts cover the global batch.
  static void sumOver(ExpertTokens &t, Communicator &comm, const CommGroup &group);
  /// Every member of `group` (the pp group: different layers each) gets
  /// all members' layers, in member order.
  static void gatherOver(ExpertTokens &t, Communicator &comm, const CommGroup &group,
                         int rank);

private:
  std::vector<std::string> order_; // first-seen order of the layers
  std::map<std::string, std::map<int, std::vector<int32_t>>> perMb_;
};

} // namespace mapp::rt

#endif // MAPP_RT_EXPERTTALLY_H

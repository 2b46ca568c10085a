//===- DataSplit.h - microbatches per data-parallel replica -----*- C++ -*-===//
//
// --dp-split K0,K1,... and --dp-balance N (docs/elastic.md, "Uneven
// data-parallel split"): how many of the step's dp x M microbatches each
// replica runs, and the balancer that moves them off a slow replica in
// place, at the end of every window of N steps.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RUN_DATASPLIT_H
#define MAPP_RUN_DATASPLIT_H

#include "mapp/rt/Elastic.h"
#include "mapp/rt/Plan.h"
#include "mapp/rt/Run.h"

#include <optional>
#include <string>
#include <vector>

namespace mapp::rt {

class DataSplit {
public:
  /// Error naming the problem when the plan or the flags cannot be served.
  DataSplit(const RunOptions &o, const Plan &plan);
  int count(int replica) const { return split_[replica]; }
  int start(int replica) const;
  int perStep() const { return total_; }
  bool balancing() const { return window_ > 0; }

  struct Decision {
    std::string line, json; // reportDecision's
  };
  /// After step `stepsDone` - 1 with every rank's compute seconds in
  /// `times` ([0, world): compute instrs; [world, 2 world): of them the
  /// microbatches' blocks; the same on every rank): at a window's end the
  /// balancer decides. Returns true when the split changed. `out` gets the
  /// decisions to report (the switch, and the gain measured in the window
  /// after the last switch).
  bool afterStep(int64_t stepsDone, const std::vector<double> &times,
                 std::vector<Decision> &out);

private:
  int window_ = 0, total_ = 0;
  std::vector<int> split_;
  std::optional<DpBalancer> balancer_;
  std::string lastSwitch_; // the evidence of the last switch, until measured
};

/// "3,5" -> {3, 5}; Error naming the flag for anything else.
std::vector<int> parseDpSplit(const std::string &text);

} // namespace mapp::rt

#endif

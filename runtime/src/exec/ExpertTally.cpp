//===- ExpertTally.cpp ----------------------------------------------------===//
#include "mapp/rt/ExpertTally.h"
#include "mapp/rt/Backend.h"
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"

#include <algorithm>

using namespace mapp::rt;

void ExpertTally::record(const std::string &instrName, int mb,
                         const Tensor &counts, Backend &backend) {
  // A recomputed forward's clone (Recompute.cpp names it "<name>.recompute")
  // routes the same tokens again: the same layer and microbatch.
  const std::string suffix = ".recompute";
  std::string name = instrName;
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    name.resize(name.size() - suffix.size());
  if (counts.type.dtype != DType::I32 || counts.rank() != 1)
    fail("moe_assign '", name, "': counts must be a 1-d i32 tensor");
  std::vector<int32_t> host(static_cast<size_t>(counts.numel()));
  backend.synchronize(); // the kernel may still be running on a device
  backend.copyFromStorage(host.data(), counts.data, host.size() * sizeof(int32_t));
  if (!perMb_.count(name))
    order_.push_back(name);
  perMb_[name][mb] = std::move(host);
}

ExpertTokens ExpertTally::take() {
  ExpertTokens out;
  for (const std::string &name : order_) {
    std::vector<int64_t> sum;
    for (const auto &[mb, counts] : perMb_[name]) {
      sum.resize(std::max(sum.size(), counts.size()), 0);
      for (size_t e = 0; e < counts.size(); ++e)
        sum[e] += counts[e];
    }
    out.emplace_back(name, std::move(sum));
  }
  order_.clear();
  perMb_.clear();
  return out;
}

void ExpertTally::sumOver(ExpertTokens &t, Communicator &comm,
                          const CommGroup &group) {
  std::vector<double> flat;
  for (const auto &[name, counts] : t)
    flat.insert(flat.end(), counts.begin(), counts.end());
  if (flat.empty())
    return;
  // Counts are integers far below 2^53: exact in doubles.
  comm.allReduce(flat.data(), static_cast<int64_t>(flat.size()), ReduceOp::Sum,
                 group);
  size_t i = 0;
  for (auto &[name, counts] : t)
    for (int64_t &c : counts)
      c = static_cast<int64_t>(flat[i++]);
}

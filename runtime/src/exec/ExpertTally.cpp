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

namespace {
// A member's layers as numbers: per layer the name's length, its bytes, the
// expert count, the counts (all small integers, exact in doubles).
std::vector<double> serialize(const ExpertTokens &t) {
  std::vector<double> out;
  for (const auto &[name, counts] : t) {
    out.push_back(static_cast<double>(name.size()));
    for (unsigned char ch : name)
      out.push_back(ch);
    out.push_back(static_cast<double>(counts.size()));
    out.insert(out.end(), counts.begin(), counts.end());
  }
  return out;
}

void deserialize(const double *p, const double *end, ExpertTokens &out) {
  while (p < end) {
    size_t len = static_cast<size_t>(*p++);
    std::string name;
    for (size_t i = 0; i < len; ++i)
      name.push_back(static_cast<char>(static_cast<int>(*p++)));
    size_t n = static_cast<size_t>(*p++);
    std::vector<int64_t> counts(p, p + n);
    p += n;
    out.emplace_back(std::move(name), std::move(counts));
  }
}
} // namespace

void ExpertTally::gatherOver(ExpertTokens &t, Communicator &comm,
                             const CommGroup &group, int rank) {
  // Two all-reduces: each member's length at its index, then each member's
  // numbers at its offset (zeros elsewhere).
  const int me = group.indexOf(rank);
  std::vector<double> mine = serialize(t);
  std::vector<double> sizes(group.size(), 0);
  sizes[me] = static_cast<double>(mine.size());
  comm.allReduce(sizes.data(), group.size(), ReduceOp::Sum, group);
  size_t total = 0, offset = 0;
  for (int i = 0; i < group.size(); ++i) {
    if (i == me)
      offset = total;
    total += static_cast<size_t>(sizes[i]);
  }
  if (total == 0)
    return;
  std::vector<double> all(total, 0);
  std::copy(mine.begin(), mine.end(), all.begin() + offset);
  comm.allReduce(all.data(), static_cast<int64_t>(total), ReduceOp::Sum, group);
  t.clear();
  deserialize(all.data(), all.data() + all.size(), t);
}

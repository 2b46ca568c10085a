//===- MoeRouting.cpp - MoE top-k and slot assignment rules ---------------===//
#include "mapp/rt/MoeRouting.h"

#include <algorithm>
#include <numeric>
#include <vector>

using namespace mapp::rt;

void mapp::rt::topkRow(const float *x, int64_t n, int64_t k, int32_t *top) {
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) {
                      return x[a] > x[b] || (x[a] == x[b] && a < b);
                    });
  std::copy(idx.begin(), idx.begin() + k, top);
}

void mapp::rt::assignSlots(const float *probs, const int32_t *experts,
                           int64_t tokens, int64_t k, int64_t numExperts,
                           int64_t capacity, int32_t *slots, int32_t *counts) {
  int64_t choices = tokens * k;
  std::vector<std::vector<int64_t>> byExpert(numExperts);
  for (int64_t i = 0; i < choices; ++i)
    byExpert[experts[i]].push_back(i); // flat order = token order
  std::vector<char> kept(choices, 1);
  for (auto &list : byExpert) {
    if (capacity <= 0 || static_cast<int64_t>(list.size()) <= capacity)
      continue;
    std::vector<int64_t> order = list;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return probs[a] > probs[b];
    });
    for (size_t r = capacity; r < order.size(); ++r)
      kept[order[r]] = 0;
  }
  std::vector<int64_t> offset(numExperts + 1, 0);
  for (int64_t e = 0; e < numExperts; ++e) {
    int64_t c = 0;
    for (int64_t i : byExpert[e])
      c += kept[i];
    counts[e] = static_cast<int32_t>(c);
    offset[e + 1] = offset[e] + c;
  }
  std::vector<int64_t> next(offset.begin(), offset.end() - 1);
  for (int64_t i = 0; i < choices; ++i)
    slots[i] = kept[i] ? static_cast<int32_t>(next[experts[i]]++) : -1;
}

//===- TraceFormat.cpp - names of the trace vocabulary --------------------===//

#include "mapp/trace/TraceFormat.h"

using namespace mapp::trace;

static const char *const kCategories[] = {"compute", "comm", "memcpy", "data",
                                          "optimizer"};
static const char *const kOps[] = {"",           "send",       "recv",
                                   "all_reduce", "all_gather", "reduce_scatter",
                                   "all_to_all", "broadcast",  "barrier"};
constexpr int kNumCategories = sizeof kCategories / sizeof *kCategories;
constexpr int kNumOps = sizeof kOps / sizeof *kOps;
static_assert(kNumCategories == int(Category::Optimizer) + 1, "names");
static_assert(kNumOps == int(Op::Barrier) + 1, "names");

const char *mapp::trace::categoryName(Category c) {
  int i = static_cast<int>(c);
  return i < kNumCategories ? kCategories[i] : "compute";
}

const char *mapp::trace::opName(Op o) {
  int i = static_cast<int>(o);
  return i < kNumOps ? kOps[i] : "";
}

bool mapp::trace::parseCategory(const std::string &s, Category &out) {
  for (int i = 0; i < kNumCategories; ++i)
    if (s == kCategories[i]) {
      out = static_cast<Category>(i);
      return true;
    }
  return false;
}

bool mapp::trace::parseOp(const std::string &s, Op &out) {
  for (int i = 0; i < kNumOps; ++i)
    if (s == kOps[i]) {
      out = static_cast<Op>(i);
      return true;
    }
  return false;
}

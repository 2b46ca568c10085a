//===- TraceFormat.cpp - names of the trace vocabulary --------------------===//

#include "mapp/trace/TraceFormat.h"

#include <cstdio>

using namespace mapp::trace;

static const char *const kCategories[] = {"compute", "comm", "memcpy", "data",
                                          "optimizer"};
static const char *const kOps[] = {"",           "send",       "recv",
                                   "all_reduce", "all_gather", "reduce_scatter",
                                   "all_to_all", "broadcast",  "barrier"};
static const char *const kPhases[] = {"", "fwd", "bwd", "bwd_input",
                                      "bwd_weight"};
constexpr int kNumPhases = sizeof kPhases / sizeof *kPhases;
static_assert(kNumPhases == int(Phase::BackwardWeight) + 1, "names");
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

const char *mapp::trace::phaseName(Phase p) {
  int i = static_cast<int>(p);
  return i < kNumPhases ? kPhases[i] : "";
}

bool mapp::trace::parsePhase(const std::string &s, Phase &out) {
  for (int i = 0; i < kNumPhases; ++i)
    if (s == kPhases[i]) {
      out = static_cast<Phase>(i);
      return true;
    }
  return false;
}

void mapp::trace::appendJsonString(std::string &out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

//===- DataSplit.cpp - microbatches per data-parallel replica -------------===//
#include "DataSplit.h"

#include "mapp/rt/Error.h"
#include "mapp/rt/Fbd.h"

#include <nlohmann/json.hpp>

#include <iomanip>
#include <numeric>
#include <sstream>

using namespace mapp::rt;
using json = nlohmann::json;

std::vector<int> mapp::rt::parseDpSplit(const std::string &text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int k = 0;
    try {
      k = std::stoi(item, &used);
    } catch (const std::exception &) {
      used = 0;
    }
    if (used == 0 || used != item.size() || k < 1)
      fail("--dp-split '", text, "': expected microbatch counts >= 1, one ",
           "per data-parallel replica (e.g. 3,5)");
    out.push_back(k);
  }
  if (out.empty())
    fail("--dp-split '", text, "': no counts");
  return out;
}

DataSplit::DataSplit(const RunOptions &o, const Plan &plan)
    : window_(o.dpBalance), total_(plan.dp * plan.numMicrobatches),
      split_(plan.dp, plan.numMicrobatches) {
  const char *what = o.dpSplit.empty() ? "--dp-balance" : "--dp-split";
  if (plan.dp < 2)
    fail(what, " moves microbatches between data-parallel replicas: the plan "
               "has dp = ", plan.dp);
  if (plan.pp > 1 || isFbdPlan(plan))
    fail(what, " needs a plan without pipeline stages (pp = 1; this one has "
               "pp = ", plan.pp, isFbdPlan(plan) ? ", split forward/backward"
                                                  : "",
         "): a stage's compiled schedule fixes its microbatches");
  if (plan.ep > 1 || plan.cp > 1)
    fail(what, " needs every replica's collectives to be its own (ep = ",
         plan.ep, ", cp = ", plan.cp, " reach across replicas per microbatch)");
  if (!o.dpSplit.empty()) {
    if (static_cast<int>(o.dpSplit.size()) != plan.dp ||
        std::accumulate(o.dpSplit.begin(), o.dpSplit.end(), 0) != total_)
      fail("--dp-split: ", o.dpSplit.size(), " count(s) summing to ",
           std::accumulate(o.dpSplit.begin(), o.dpSplit.end(), 0),
           "; the plan needs ", plan.dp, " (one per replica) summing to ",
           total_, " (dp ", plan.dp, " x ", plan.numMicrobatches,
           " microbatches: the global batch)");
    split_ = o.dpSplit;
  }
  if (window_ > 0) {
    balancer_.emplace(plan.dp, plan.tp, plan.numMicrobatches);
    balancer_->setSplit(split_);
  }
}

int DataSplit::start(int replica) const {
  return std::accumulate(split_.begin(), split_.begin() + replica, 0);
}

namespace {
std::string fixed2(double v) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(2) << v;
  return s.str();
}
} // namespace

bool DataSplit::afterStep(int64_t stepsDone, const std::vector<double> &times,
                          std::vector<Decision> &out) {
  if (!balancer_)
    return false;
  const size_t w = times.size() / 2;
  balancer_->addStep({times.begin(), times.begin() + w},
                     {times.begin() + w, times.end()});
  if (stepsDone % window_ != 0)
    return false;
  std::string evidence;
  const int changed = balancer_->decide(&evidence);
  json ev = json::parse(evidence);
  if (!lastSwitch_.empty()) { // the window after a switch measures it
    json sw = json::parse(lastSwitch_);
    const double before = sw.value("step_ms", 0.0),
                 predicted = sw.value("step_ms_predicted", 0.0),
                 now = ev.value("step_ms", 0.0);
    if (before > 0 && predicted > 0 && now > 0) {
      json j = {{"event", "elastic"},
                {"decision", "dp-split-measured"},
                {"step", stepsDone},
                {"microbatches", sw["microbatches_next"]},
                {"step_ms_before", before},
                {"step_ms_predicted", predicted},
                {"step_ms_measured", now},
                {"predicted_gain", before / predicted},
                {"measured_gain", before / now}};
      out.push_back({"after the dp split to " + sw["microbatches_next"].dump() +
                         ": slowest replica " + fixed2(now) + " ms a step, " +
                         fixed2(before) + " before; measured gain " +
                         fixed2(before / now) + "x, predicted " +
                         fixed2(before / predicted) + "x",
                     j.dump()});
    }
    lastSwitch_.clear();
  }
  if (!changed) { // the monitor alone: why this window stayed
    out.push_back({"", json({{"event", "elastic"},
                             {"decision", "dp-split-window"},
                             {"step", stepsDone},
                             {"evidence", ev}})
                           .dump()});
    return false;
  }
  std::string times_ms;
  for (const json &t : ev["replica_ms"])
    times_ms += " " + fixed2(t.get<double>());
  json j = {{"event", "elastic"},
            {"decision", "dp-split"},
            {"step", stepsDone},
            {"evidence", ev}};
  out.push_back({"dp split at step " + std::to_string(stepsDone) +
                     ": replica times (ms)" + times_ms + "; microbatches " +
                     ev["microbatches_now"].dump() + " -> " +
                     ev["microbatches_next"].dump() + ", predicted gain " +
                     fixed2(ev.value("predicted_gain", 0.0)) + "x",
                 j.dump()});
  split_ = balancer_->split();
  lastSwitch_ = evidence;
  return true;
}

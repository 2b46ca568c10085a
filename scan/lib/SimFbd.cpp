//===- SimFbd.cpp - MegaFBD pieces of mapp-sim's plan replay --------------===//

#include "SimFbd.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

using namespace mapp::scan;
namespace rt = mapp::rt;

bool fbd::namedGroup(const rt::Plan &plan, const rt::Program &p,
                     const std::string &name, std::vector<int> &members,
                     std::string *error) {
  members.clear();
  if (name == "world") {
    for (int r = 0; r < plan.worldSize; ++r)
      members.push_back(r);
    return true;
  }
  // The side's layout in Megatron order (Comm.h Layout): the backward side
  // (or an unsplit plan) from rank 0, the forward side after it at its own
  // tp (runtime Executor: comm.setSecondLayout(fbdForwardLayout, base)).
  int tp = plan.tp, base = 0;
  if (p.placement.role == "fwd") {
    base = plan.tp * plan.dp * plan.pp;
    tp = p.placement.tp > 0 ? p.placement.tp : plan.tp;
  }
  int local = p.rank - base;
  int t = local % tp, d = (local / tp) % plan.dp, s = local / (tp * plan.dp);
  auto rankOf = [&](int ti, int di, int si) {
    return base + ti + tp * (di + plan.dp * si);
  };
  if (name == "tp") {
    for (int i = 0; i < tp; ++i)
      members.push_back(rankOf(i, d, s));
  } else if (name == "dp" || name == "ep") {
    for (int i = 0; i < plan.dp; ++i)
      members.push_back(rankOf(t, i, s));
  } else if (name == "pp") {
    for (int i = 0; i < plan.pp; ++i)
      members.push_back(rankOf(t, d, i));
  } else if (name == "cp" && plan.cp > 0) {
    // cp consecutive dp ranks (docs/context-parallel.md).
    for (int i = d - d % plan.cp; i < d - d % plan.cp + plan.cp; ++i)
      members.push_back(rankOf(t, i, s));
  } else {
    *error = "rank " + std::to_string(p.rank) + ": unknown group '" + name +
             "' (tp | dp | ep | pp | cp | world)";
    return false;
  }
  return true;
}

namespace {

int findParam(const rt::Program &p, const std::string &name) {
  for (size_t v = 0; v < p.values.size(); ++v)
    if (p.values[v].kind == rt::ValueKind::Param && p.values[v].name == name)
      return int(v);
  return -1;
}

/// syncFbdParams' rule: a backward rank sends its piece of a sharded
/// parameter, a replicated one from tp index 0 only.
bool sends(const rt::Program &b, const rt::Value &v) {
  return v.shardDim >= 0 || b.tp == 0;
}

} // namespace

bool fbd::paramMessages(const rt::Plan &plan, std::vector<ParamMessage> &out,
                        std::string *error) {
  out.clear();
  for (const rt::Program &b : plan.programs) {
    if (b.placement.role != "bwd")
      continue;
    for (const rt::Program &f : plan.programs) {
      if (f.placement.role != "fwd" || f.pp != b.pp || f.dp != b.dp)
        continue;
      uint64_t elems = 0;
      for (const rt::Value &fv : f.values) {
        if (fv.kind != rt::ValueKind::Param)
          continue;
        int v = findParam(b, fv.name);
        if (v < 0) {
          *error = "forward rank " + std::to_string(f.rank) +
                   " holds parameter '" + fv.name + "' that backward rank " +
                   std::to_string(b.rank) + " does not";
          return false;
        }
        if (sends(b, b.values[v]))
          elems += uint64_t(b.values[v].type.numel());
      }
      // The runtime copies fp32 whatever the storage (readFloats).
      out.push_back({b.rank, f.rank, elems * sizeof(float)});
    }
  }
  std::sort(out.begin(), out.end(), [](const auto &x, const auto &y) {
    return std::make_pair(x.bwd, x.fwd) < std::make_pair(y.bwd, y.fwd);
  });
  return true;
}

std::vector<uint64_t> fbd::stagingBytes(const rt::Plan &plan,
                                        const std::vector<ParamMessage> &msgs) {
  std::map<int, size_t> index; // rank -> program index
  for (size_t i = 0; i < plan.programs.size(); ++i)
    index[plan.programs[i].rank] = i;
  std::vector<uint64_t> out(plan.programs.size(), 0);
  std::vector<uint64_t> largestMsg(plan.programs.size(), 0);
  for (const ParamMessage &m : msgs) {
    size_t b = index[m.bwd], f = index[m.fwd];
    largestMsg[b] = std::max(largestMsg[b], m.bytes);
    out[f] += m.bytes; // a forward rank holds every piece until it rebuilds
  }
  for (size_t i = 0; i < plan.programs.size(); ++i) {
    const rt::Program &p = plan.programs[i];
    if (p.placement.role.empty())
      continue;
    // The backward side's degree: how many pieces a full tensor has.
    int n = plan.tp;
    uint64_t largest = 0; // one tensor's staging, in elements
    for (const rt::Value &v : p.values) {
      if (v.kind != rt::ValueKind::Param)
        continue;
      uint64_t own = uint64_t(v.type.numel());
      if (p.placement.role == "bwd") {
        largest = std::max(largest, own);
        continue;
      }
      // Full tensor: the backward piece times n when sharded there.
      uint64_t full = own;
      for (const rt::Program &b : plan.programs)
        if (b.placement.role == "bwd" && b.pp == p.pp && b.dp == p.dp) {
          int bv = findParam(b, v.name);
          if (bv >= 0)
            full = uint64_t(b.values[bv].type.numel()) *
                   (b.values[bv].shardDim >= 0 ? n : 1);
          break;
        }
      largest = std::max(largest, full + own);
    }
    out[i] += largestMsg[i] + largest * sizeof(float);
  }
  return out;
}

bool mapp::scan::parseDeviceSpeed(const std::string &text,
                                  std::map<std::string, double> &out,
                                  std::string *error) {
  out.clear();
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq);
    if (eq == std::string::npos || key.empty()) {
      *error = "--device-speed: '" + item +
               "' is not KEY=SPEED (e.g. cpu=0.05,cuda=1)";
      return false;
    }
    if (key != "cpu" && key != "cuda" && key != "fwd" && key != "bwd") {
      *error = "--device-speed: unknown device '" + key +
               "' (cpu | cuda for a placement's backend, fwd | bwd for its "
               "role)";
      return false;
    }
    std::string v = item.substr(eq + 1);
    double speed = 0;
    try {
      size_t used = 0;
      speed = std::stod(v, &used);
      if (used != v.size())
        speed = 0;
    } catch (const std::exception &) {
      speed = 0;
    }
    if (!std::isfinite(speed) || speed <= 0) {
      *error = "--device-speed: speed of '" + key +
               "' must be a positive number, got '" + v + "'";
      return false;
    }
    if (!out.emplace(key, speed).second) {
      *error = "--device-speed: '" + key + "' given twice";
      return false;
    }
  }
  if (out.empty()) {
    *error = "--device-speed expects KEY=SPEED,... (e.g. cpu=0.05,cuda=1)";
    return false;
  }
  return true;
}

double fbd::speedOf(const PlanCluster &c, const rt::Program &p) {
  double s = 1;
  for (const std::string &key : {p.placement.backend, p.placement.role}) {
    auto it = c.deviceSpeed.find(key);
    if (!key.empty() && it != c.deviceSpeed.end())
      s *= it->second;
  }
  return s;
}

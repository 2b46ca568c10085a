//===- FaultSpec.cpp - the fault-spec grammar -----------------------------===//
#include "mapp/rt/FaultSpec.h"

#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <type_traits>

using namespace mapp::rt;

namespace {

struct KindInfo {
  FaultSpec::Kind kind;
  const char *name;
  const char *usage; // the required keys, for "needs" messages
  const char *keys;  // every key it takes, for "unknown key" messages
};

const KindInfo kKinds[] = {
    {FaultSpec::SlowCompute, "slow-compute", "rank=R,factor=F",
     "rank, factor, from-step, to-step"},
    {FaultSpec::LinkDelay, "link-delay", "src=A,dst=B,us=U",
     "src, dst, us, from-step, to-step"},
    {FaultSpec::LinkBandwidth, "link-bandwidth", "src=A,dst=B,gbps=G",
     "src, dst, gbps, from-step, to-step"},
    {FaultSpec::MonitorSilence, "monitor-silence", "rank=R",
     "rank, from-step, to-step"},
    {FaultSpec::Stop, "stop", "rank=R", "rank, from-step"},
    {FaultSpec::RankCrash, "rank-crash", "rank=R,at-step=K",
     "rank, at-step, back-at-step"},
};

/// Joins streamable parts into *error and returns false.
template <typename... Parts> bool bad(std::string *error, const Parts &...p) {
  std::ostringstream os;
  (os << ... << p);
  *error = os.str();
  return false;
}

} // namespace

const char *mapp::rt::faultKindName(FaultSpec::Kind k) {
  for (const KindInfo &i : kKinds)
    if (i.kind == k)
      return i.name;
  return "?";
}

bool mapp::rt::parseFaultSpec(const std::string &spec, FaultSpec &in,
                              std::string *error) {
  size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  const KindInfo *info = nullptr;
  for (const KindInfo &i : kKinds)
    if (kind == i.name)
      info = &i;
  if (!info)
    return bad(error, "unknown kind '", kind,
               "' (slow-compute, link-delay, link-bandwidth, "
               "monitor-silence, stop, rank-crash)");
  in = FaultSpec();
  in.kind = info->kind;
  std::map<std::string, std::string> kv;
  if (colon != std::string::npos) {
    std::string rest = spec.substr(colon + 1);
    size_t pos = 0;
    while (pos <= rest.size()) {
      size_t comma = rest.find(',', pos);
      std::string item = rest.substr(
          pos, comma == std::string::npos ? std::string::npos : comma - pos);
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        return bad(error, "expected key=value, got '", item, "'");
      kv[item.substr(0, eq)] = item.substr(eq + 1);
      if (comma == std::string::npos)
        break;
      pos = comma + 1;
    }
  }
  // Reads and removes kv[key], a number >= lo (an integer when asked).
  std::string why;
  auto num = [&](const char *key, double lo, bool integer, double &out) {
    auto it = kv.find(key);
    if (it == kv.end()) {
      bad(&why, kind, " needs ", key, "= (", kind, ":", info->usage, ")");
      return false;
    }
    try {
      size_t used;
      double v = std::stod(it->second, &used);
      // !isfinite first: NaN passes `v < lo`, and casting 1e300 is UB.
      if (used != it->second.size() || !std::isfinite(v) || v < lo ||
          (integer && (v > 2147483647.0 || v != std::floor(v))))
        throw std::invalid_argument(it->second);
      kv.erase(it);
      out = v;
      return true;
    } catch (const std::exception &) {
      bad(&why, key, " must be ", integer ? "an integer" : "a number",
          " >= ", lo, ", got '", it->second, "'");
      return false;
    }
  };
  auto integer = [&](const char *key, auto &out) {
    double v;
    if (!num(key, 0, true, v))
      return false;
    out = static_cast<std::remove_reference_t<decltype(out)>>(v);
    return true;
  };
  bool ok = true;
  switch (in.kind) {
  case FaultSpec::SlowCompute:
    ok = integer("rank", in.rank) && num("factor", 1, false, in.factor);
    break;
  case FaultSpec::LinkDelay:
    ok = integer("src", in.src) && integer("dst", in.dst) &&
         num("us", 0, false, in.us);
    break;
  case FaultSpec::LinkBandwidth:
    ok = integer("src", in.src) && integer("dst", in.dst) &&
         num("gbps", 1e-9, false, in.gbps);
    break;
  case FaultSpec::MonitorSilence:
  case FaultSpec::Stop:
    ok = integer("rank", in.rank);
    break;
  case FaultSpec::RankCrash:
    ok = integer("rank", in.rank) && integer("at-step", in.fromStep);
    if (ok && kv.count("back-at-step")) {
      ok = integer("back-at-step", in.toStep);
      if (ok && in.toStep <= in.fromStep)
        return bad(error, "back-at-step (", in.toStep,
                   ") must be greater than at-step (", in.fromStep, ")");
    }
    if (ok && (kv.count("from-step") || kv.count("to-step")))
      return bad(error, "rank-crash takes at-step= and back-at-step=, not "
                        "from-step/to-step");
    break;
  }
  if (ok && kv.count("from-step"))
    ok = integer("from-step", in.fromStep);
  if (ok && kv.count("to-step") && in.kind == FaultSpec::Stop)
    return bad(error, "stop takes no to-step (the process stays stopped "
                      "until it gets SIGCONT)");
  if (ok && kv.count("to-step")) {
    ok = integer("to-step", in.toStep);
    if (ok && in.toStep <= in.fromStep)
      return bad(error, "to-step (", in.toStep,
                 ") must be greater than from-step (", in.fromStep, ")");
  }
  if (!ok) {
    *error = why;
    return false;
  }
  if (!kv.empty())
    return bad(error, "unknown key '", kv.begin()->first, "' (keys of ", kind,
               ": ", info->keys, ")");
  if ((in.kind == FaultSpec::LinkDelay ||
       in.kind == FaultSpec::LinkBandwidth) &&
      in.src == in.dst)
    return bad(error, "src and dst are the same rank (", in.src, ")");
  return true;
}

//===- CostModel.cpp - profiles, clusters and the cost primitives ---------===//

#include "mapp/cost/CostModel.h"
#include "mapp/rt/RegularFile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

using namespace mapp::cost;
using json = nlohmann::json;

namespace {

/// Default profiles. GPUs: dense bf16 GEMM at ~75% of the data-sheet peak
/// (what cuBLAS reaches on large transformer shapes), streaming at ~80% of
/// the HBM peak, NVLink per direction inside a node, one 200/400 Gb/s NIC
/// per GPU between nodes, 0.6 GiB held beside the plan (an H100 running
/// the 1.3B GPT, 2026-12-06: 0.55-0.60 GiB of workspaces and kernels).
/// CPU: this project's CI machine class (OpenBLAS sgemm on one core, ~10
/// GB/s streaming); calibrate to replace it.
struct Default {
  const char *kind;
  double f32, bf16, fp8, peakBf16, memGBps, overheadUs;
  Link intra, inter;
  double memoryGiB;
  bool bf16Storage;
  double runtimeReserveGiB;
};
const Default kDefaults[] = {
    {"cpu", 0.05, 0, 0, 0.05, 8, 6, {40, 10}, {10, 30}, 16, false, 0},
    {"a100", 19.5, 234, 0, 312, 1600, 4, {2400, 2}, {200, 5}, 80, true, 0.6},
    {"h100", 60, 740, 1480, 989, 2700, 3, {3600, 2}, {400, 5}, 80, true, 0.6},
    {"h200", 60, 740, 1480, 989, 3900, 3, {3600, 2}, {400, 5}, 141, true, 0.6},
};

struct Reader {
  std::string name; // file name for messages
  std::string *error;
  bool fail(const std::string &key, const std::string &msg) {
    if (error)
      *error = name + ": key '" + key + "': " + msg;
    return false;
  }
  bool number(const json &v, const std::string &key, double &out,
              bool positive = true) {
    if (!v.is_number())
      return fail(key, "expected a number, got " + v.dump());
    double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (positive && x <= 0))
      return fail(key, std::string("expected a ") +
                           (positive ? "positive" : "non-negative") +
                           " number, got " + v.dump());
    out = x;
    return true;
  }
  bool link(const json &v, const std::string &key, Link &out) {
    if (!v.is_object())
      return fail(key, "expected an object {\"gbps\": G, \"latency_us\": L}");
    for (auto &[k, x] : v.items()) {
      if (k == "gbps") {
        if (!number(x, key + ".gbps", out.gbps))
          return false;
      } else if (k == "latency_us") {
        if (!number(x, key + ".latency_us", out.latencyUs, false))
          return false;
      } else
        return fail(key + "." + k, "unknown key (expected gbps, latency_us)");
    }
    return true;
  }
  /// gemm_rates: {"f32": [[dim, tflops], ...], ...}, dims increasing.
  bool rates(const json &v, const std::string &key, Profile &out) {
    if (!v.is_object())
      return fail(key, "expected an object {\"f32\": [[D, T], ...], ...}");
    for (auto &[d, list] : v.items()) {
      auto *slot = d == "f32"    ? &out.gemmRatesF32
                   : d == "bf16" ? &out.gemmRatesBf16
                   : d == "fp8"  ? &out.gemmRatesFp8
                                 : nullptr;
      std::string at = key + "." + d;
      if (!slot)
        return fail(at, "unknown dtype (expected f32, bf16, fp8)");
      if (!list.is_array())
        return fail(at, "expected a list of [smallest dimension, TFLOP/s]");
      slot->clear();
      for (size_t i = 0; i < list.size(); ++i) {
        std::string item = at + "[" + std::to_string(i) + "]";
        if (!list[i].is_array() || list[i].size() != 2)
          return fail(item, "expected [smallest dimension, TFLOP/s], got " +
                                list[i].dump());
        Profile::RatePoint pt{};
        if (!number(list[i][0], item, pt.dim) ||
            !number(list[i][1], item, pt.tflops))
          return false;
        if (!slot->empty() && pt.dim <= slot->back().dim)
          return fail(item, "dimensions must increase (" +
                                list[i][0].dump() + " after " +
                                list[i - 1][0].dump() + ")");
        slot->push_back(pt);
      }
    }
    return true;
  }
  bool parse(const std::string &text, json &out) {
    try {
      out = json::parse(text);
    } catch (const json::exception &e) {
      if (error)
        *error = name + ": invalid JSON: " + e.what();
      return false;
    }
    if (!out.is_object()) {
      if (error)
        *error = name + ": expected a JSON object";
      return false;
    }
    return true;
  }
};

bool readFile(const std::string &path, std::string &text, std::string *error) {
  std::string why;
  bool notRegular = false;
  if (!mapp::rt::readRegularFile(path, text, why, &notRegular)) {
    if (error)
      *error = mapp::rt::openFailure("", path, why, notRegular);
    return false;
  }
  return true;
}

} // namespace

std::string mapp::cost::knownDeviceKinds() {
  std::string s;
  for (const Default &d : kDefaults)
    s += (s.empty() ? "" : ", ") + std::string(d.kind);
  return s;
}

bool mapp::cost::defaultProfile(const std::string &kind, Profile &out) {
  for (const Default &d : kDefaults)
    if (kind == d.kind) {
      out = Profile();
      out.deviceKind = d.kind;
      out.source = "default (" + kind + ")";
      out.gemmTflopsF32 = d.f32;
      out.gemmTflopsBf16 = d.bf16;
      out.gemmTflopsFp8 = d.fp8;
      out.peakTflops = d.peakBf16;
      out.memGBps = d.memGBps;
      out.opOverheadUs = d.overheadUs;
      out.intra = d.intra;
      out.inter = d.inter;
      out.memoryGiB = d.memoryGiB;
      out.bf16Storage = d.bf16Storage;
      out.runtimeReserveGiB = d.runtimeReserveGiB;
      out.attentionScoresInMemory = kind == "cpu";
      return true;
    }
  return false;
}

bool mapp::cost::parseProfile(const std::string &text, const std::string &name,
                              Profile &out, std::string *error) {
  Reader r{name, error};
  json j;
  if (!r.parse(text, j))
    return false;
  // The device kind first: its default fills what the file leaves out.
  if (!j.contains("device"))
    return r.fail("device", "missing (the device kind: " + knownDeviceKinds() +
                                ")");
  if (!j["device"].is_string())
    return r.fail("device", "expected a string");
  std::string kind = j["device"].get<std::string>();
  if (!defaultProfile(kind, out))
    return r.fail("device", "unknown device kind '" + kind + "' (expected " +
                                knownDeviceKinds() + ")");
  out.source = name;
  for (auto &[k, v] : j.items()) {
    if (k == "device" || k == "_comment" || k == "measured")
      continue;
    if (k == "gemm_tflops") {
      if (!v.is_object())
        return r.fail(k, "expected an object {\"f32\": T, \"bf16\": T, "
                         "\"fp8\": T}");
      for (auto &[d, x] : v.items()) {
        double *slot = d == "f32"    ? &out.gemmTflopsF32
                       : d == "bf16" ? &out.gemmTflopsBf16
                       : d == "fp8"  ? &out.gemmTflopsFp8
                                     : nullptr;
        if (!slot)
          return r.fail(k + "." + d, "unknown dtype (expected f32, bf16, fp8)");
        if (!r.number(x, k + "." + d, *slot, false))
          return false;
      }
    } else if (k == "gemm_rates") {
      if (!r.rates(v, k, out))
        return false;
    } else if (k == "peak_tflops") {
      if (!r.number(v, k, out.peakTflops))
        return false;
    } else if (k == "attention_efficiency") {
      if (!r.number(v, k, out.attentionEfficiency))
        return false;
      if (out.attentionEfficiency > 1)
        return r.fail(k, "expected a fraction in (0, 1]");
    } else if (k == "attention_scores") {
      if (!v.is_string() ||
          (v.get<std::string>() != "memory" && v.get<std::string>() != "on-chip"))
        return r.fail(k, "expected \"memory\" or \"on-chip\"");
      out.attentionScoresInMemory = v.get<std::string>() == "memory";
    } else if (k == "activation_gelems") {
      if (!r.number(v, k, out.activationGelems, false))
        return false;
    } else if (k == "mem_gbps") {
      if (!r.number(v, k, out.memGBps))
        return false;
    } else if (k == "op_overhead_us") {
      if (!r.number(v, k, out.opOverheadUs, false))
        return false;
    } else if (k == "memory_gib") {
      if (!r.number(v, k, out.memoryGiB))
        return false;
    } else if (k == "runtime_reserve_gib") {
      if (!r.number(v, k, out.runtimeReserveGiB, false))
        return false;
    } else if (k == "shared_cores") {
      if (!r.number(v, k, out.sharedCores, false))
        return false;
    } else if (k == "busy_wait") {
      if (!v.is_boolean())
        return r.fail(k, "expected true or false");
      out.busyWait = v.get<bool>();
    } else if (k == "collectives") {
      if (!v.is_string() ||
          (v.get<std::string>() != "ring" && v.get<std::string>() != "shared-memory"))
        return r.fail(k, "expected \"ring\" or \"shared-memory\"");
      out.sharedMemoryCollectives = v.get<std::string>() == "shared-memory";
    } else if (k == "bf16_storage") {
      if (!v.is_boolean())
        return r.fail(k, "expected true or false");
      out.bf16Storage = v.get<bool>();
    } else if (k == "links") {
      if (!v.is_object())
        return r.fail(k, "expected an object {\"intra\": {...}, \"inter\": "
                         "{...}}");
      for (auto &[c, x] : v.items()) {
        if (c == "intra") {
          if (!r.link(x, "links.intra", out.intra))
            return false;
        } else if (c == "inter") {
          if (!r.link(x, "links.inter", out.inter))
            return false;
        } else if (c == "p2p") {
          out.haveP2p = true;
          if (!r.link(x, "links.p2p", out.p2p))
            return false;
        } else
          return r.fail("links." + c, "unknown link class (expected intra, "
                                      "inter, p2p)");
      }
    } else
      return r.fail(k, "unknown key (expected device, gemm_tflops, "
                       "gemm_rates, peak_tflops, attention_efficiency, mem_gbps, "
                       "activation_gelems, "
                       "op_overhead_us, memory_gib, shared_cores, "
                       "busy_wait, collectives, bf16_storage, links, "
                       "measured)");
  }
  if (out.gemmTflopsF32 <= 0 && out.gemmTflopsBf16 <= 0)
    return r.fail("gemm_tflops", "no dtype with a positive rate");
  return true;
}

bool mapp::cost::parseCluster(const std::string &text, const std::string &name,
                              Cluster &out, std::string *error) {
  Reader r{name, error};
  json j;
  if (!r.parse(text, j))
    return false;
  out = Cluster();
  out.source = name;
  for (auto &[k, v] : j.items()) {
    if (k == "_comment")
      continue;
    if (k == "device") {
      Profile unused;
      if (!v.is_string() || !defaultProfile(v.get<std::string>(), unused))
        return r.fail(k, "expected a device kind (" + knownDeviceKinds() +
                             "), got " + v.dump());
      out.deviceKind = v.get<std::string>();
    } else if (k == "devices_per_node" || k == "gpus_per_node" ||
               k == "nodes") {
      double x;
      if (!r.number(v, k, x) || x != std::floor(x) || x > 1e6)
        return r.fail(k, "expected a positive integer, got " + v.dump());
      (k == "nodes" ? out.nodes : out.devicesPerNode) = int(x);
    } else if (k == "memory_gib") {
      if (!r.number(v, k, out.memoryGiB))
        return false;
    } else if (k == "intra") {
      out.haveIntra = true;
      if (!r.link(v, k, out.intra))
        return false;
    } else if (k == "inter") {
      out.haveInter = true;
      if (!r.link(v, k, out.inter))
        return false;
    } else
      return r.fail(k, "unknown key (expected device, devices_per_node, "
                       "nodes, memory_gib, intra, inter)");
  }
  return true;
}

bool mapp::cost::loadProfile(const std::string &path, Profile &out,
                             std::string *error) {
  std::string text;
  return readFile(path, text, error) && parseProfile(text, path, out, error);
}

bool mapp::cost::loadCluster(const std::string &path, Cluster &out,
                             std::string *error) {
  std::string text;
  return readFile(path, text, error) && parseCluster(text, path, out, error);
}

Profile mapp::cost::effectiveProfile(const Cluster &cluster,
                                     const Profile *measured,
                                     std::vector<std::string> &warnings) {
  Profile p;
  if (measured) {
    p = *measured;
    if (p.deviceKind != cluster.deviceKind)
      warnings.push_back("profile '" + p.source + "' was measured on a " +
                         p.deviceKind + " but the cluster '" + cluster.source +
                         "' has " + cluster.deviceKind +
                         " devices: pricing with the " + p.deviceKind +
                         " rates");
  } else {
    defaultProfile(cluster.deviceKind, p);
  }
  // The cluster's network and memory are facts of the cluster; a measured
  // profile's links stand unless the cluster names them.
  if (cluster.haveIntra)
    p.intra = cluster.intra;
  if (cluster.haveInter)
    p.inter = cluster.inter;
  if (cluster.memoryGiB > 0)
    p.memoryGiB = cluster.memoryGiB;
  return p;
}

std::string mapp::cost::profileJson(const Profile &p) {
  json j = {{"device", p.deviceKind},
            {"gemm_tflops",
             {{"f32", p.gemmTflopsF32},
              {"bf16", p.gemmTflopsBf16},
              {"fp8", p.gemmTflopsFp8}}},
            {"peak_tflops", p.peakTflops},
            {"attention_efficiency", p.attentionEfficiency},
            {"attention_scores", p.attentionScoresInMemory ? "memory" : "on-chip"},
            {"mem_gbps", p.memGBps},
            {"op_overhead_us", p.opOverheadUs},
            {"memory_gib", p.memoryGiB},
            {"bf16_storage", p.bf16Storage},
            {"runtime_reserve_gib", p.runtimeReserveGiB},
            {"links",
             {{"intra", {{"gbps", p.intra.gbps},
                         {"latency_us", p.intra.latencyUs}}},
              {"inter", {{"gbps", p.inter.gbps},
                         {"latency_us", p.inter.latencyUs}}}}}};
  for (auto [name, list] : {std::pair{"f32", &p.gemmRatesF32},
                             std::pair{"bf16", &p.gemmRatesBf16},
                             std::pair{"fp8", &p.gemmRatesFp8}})
    for (const Profile::RatePoint &pt : *list)
      j["gemm_rates"][name].push_back({pt.dim, pt.tflops});
  if (p.activationGelems > 0)
    j["activation_gelems"] = p.activationGelems;
  if (p.sharedCores > 0)
    j["shared_cores"] = p.sharedCores;
  if (p.busyWait)
    j["busy_wait"] = true;
  if (p.sharedMemoryCollectives)
    j["collectives"] = "shared-memory";
  if (p.haveP2p)
    j["links"]["p2p"] = {{"gbps", p.p2p.gbps}, {"latency_us", p.p2p.latencyUs}};
  return j.dump(2);
}

const char *mapp::cost::dtypeName(DType d) {
  return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "fp8";
}

double mapp::cost::gemmTflops(const Profile &p, DType d) {
  return d == DType::F32 ? p.gemmTflopsF32
         : d == DType::BF16 ? p.gemmTflopsBf16
                            : p.gemmTflopsFp8;
}

namespace {
const std::vector<Profile::RatePoint> &ratesOf(const Profile &p, DType d) {
  return d == DType::F32    ? p.gemmRatesF32
         : d == DType::BF16 ? p.gemmRatesBf16
                            : p.gemmRatesFp8;
}
} // namespace

double mapp::cost::gemmTflops(const Profile &p, DType d, double minDim) {
  const auto &pts = ratesOf(p, d);
  if (pts.empty() || minDim <= 0)
    return gemmTflops(p, d);
  if (minDim <= pts.front().dim)
    return pts.front().tflops;
  if (minDim >= pts.back().dim)
    return pts.back().tflops;
  size_t i = 1;
  while (pts[i].dim < minDim)
    ++i;
  const auto &a = pts[i - 1], &b = pts[i];
  double f = std::log(minDim / a.dim) / std::log(b.dim / a.dim);
  return std::exp(std::log(a.tflops) + f * std::log(b.tflops / a.tflops));
}

double Costs::activationNs(double elements, double bytes) const {
  if (p.activationGelems <= 0)
    return 0;
  return std::max(0.0, elements / p.activationGelems - bytes / p.memGBps);
}

double Costs::gemmNs(const std::vector<GemmShape> &gemms, DType d) const {
  double ns = 0;
  for (const GemmShape &g : gemms) {
    double rate = gemmTflops(p, d, g.minDim()) * 1e3; // FLOP per ns
    if (rate > 0 && g.flops() > 0)
      ns += g.flops() / rate;
  }
  return ns;
}

double Costs::instrNs(double flops, double bytes, DType d, bool attention,
                      double minDim) const {
  double rate =
      gemmTflops(p, d, minDim) * (attention ? p.attentionEfficiency : 1);
  double ns = bytes / p.memGBps;
  if (flops > 0 && rate > 0)
    ns = std::max(ns, flops / (rate * 1e3));
  return ns + p.opOverheadUs * 1e3;
}

double Costs::bulkNs(double gemmFlops, double attentionFlops, double bytes,
                     double ops, DType d) const {
  double rate = gemmTflops(p, d) * 1e3; // FLOP per ns
  double ns = bytes / p.memGBps + ops * p.opOverheadUs * 1e3;
  if (rate > 0)
    ns += gemmFlops / rate + attentionFlops / (rate * p.attentionEfficiency);
  return ns;
}

double Costs::p2pNs(double bytes, bool sameNode) const {
  return linkNs(sameNode ? p.intra : p.inter, bytes);
}

double Costs::collectiveNs(Coll kind, double bytes, int n,
                           bool sameNode) const {
  if (n <= 1)
    return 0;
  const Link &l = sameNode ? p.intra : p.inter;
  if (p.sharedMemoryCollectives)
    return sharedMemorySyncs(kind) * l.latencyUs * 1e3 +
           (kind == Coll::AllReduce ? 2 : 1) * bytes * 8 / l.gbps;
  return ringSteps(kind, n) * linkNs(l, bytes / n);
}

double Costs::shareFactor(int ranksOnMachine) const {
  if (p.sharedCores <= 0 || ranksOnMachine <= p.sharedCores)
    return 1;
  return ranksOnMachine / p.sharedCores;
}

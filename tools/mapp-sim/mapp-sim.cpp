//===- mapp-sim.cpp - Simulate a training job and write its traces --------===//
//
// mapp-sim --config job.json -o DIR [--inject FAULT]... [--seed S]
// mapp-sim --config job.json --what-if report.json [--inject FAULT]...
// mapp-sim PLAN.mplan... [--compare S1,S2,...] [cluster options]
// See docs/mapp-sim.md.
//
//===----------------------------------------------------------------------===//

#include "mapp/cost/CostModel.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/scan/Sim.h"
#include "mapp/scan/SimPlan.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

using namespace mapp::scan;

static const char *kUsage =
    "usage: mapp-sim --config job.json [-o DIR] [--inject FAULT]...\n"
    "                [--seed S] [--what-if report.json] [-q]\n"
    "  FAULT: slow-compute:rank=R,factor=F | link-delay:src=A,dst=B,us=U |\n"
    "         link-bandwidth:src=A,dst=B,gbps=G   (repeatable)\n"
    "  -o DIR           write DIR/rank-{r}.trace.jsonl and DIR/sim-truth.json\n"
    "  --summaries F    write the live monitor's step summaries of every\n"
    "                   rank to F (mapp-scan --replay-summaries F)\n"
    "  --what-if FILE   re-simulate with the culprits that a mapp-scan\n"
    "                   report names removed; print the step time saved\n"
    "       mapp-sim PLAN.mplan... [--compare S1,S2,...] [--steps N]\n"
    "                [--gbps G] [--latency-us L] [--intra-gbps G]\n"
    "                [--intra-latency-us L] [--gpus-per-node N]\n"
    "                [--tflops T] [--mem-gbps M] [--uniform-costs F,B[,Bi,W]]\n"
    "                [--mem-cap BYTES] [--inject FAULT]... [--json]\n"
    "                [--device-speed KEY=S,...] [--coordinator=on|off]\n"
    "                [--profile profile.json]\n"
    "  replays the plans' schedules (S: a plan's schedule, dfc, bfc or\n"
    "  adaptive) and prints step time and peak memory per rank\n"
    "  --device-speed   compute speed relative to --tflops/--mem-gbps by\n"
    "                   placement backend (cpu, cuda) or role (fwd, bwd) of\n"
    "                   a split plan, e.g. cpu=0.05; factors that match a\n"
    "                   rank multiply\n"
    "  --profile        device and link rates from a measured profile\n"
    "                   (mapp-run --calibrate; the cost model the\n"
    "                   auto-parallel search uses); later flags override\n"
    "  --coordinator    split plans: the step-end parameter copy through the\n"
    "                   coordinator (on, the default, as mapp-run) or not\n";

static int fail(const std::string &msg) {
  std::fprintf(stderr, "mapp-sim: error: %s\n", msg.c_str());
  return 1;
}

static double meanMs(const SimConfig &c, bool &ok, std::string &err) {
  SimJob job;
  SimTimes times;
  ok = buildSimJob(c, job, &err) && runSim(job, makeNetwork(c), times, &err);
  if (!ok)
    return 0;
  std::vector<double> st = stepTimesNs(job, times);
  return std::accumulate(st.begin(), st.end(), 0.0) / st.size() * 1e-6;
}

static bool number(const std::string &flag, const std::string &v, double &out,
                   std::string &err) {
  try {
    size_t used = 0;
    out = std::stod(v, &used);
    if (used == v.size() && std::isfinite(out) && out >= 0)
      return true;
  } catch (const std::exception &) {
  }
  err = flag + " expects a non-negative number, got '" + v + "'";
  return false;
}

static std::vector<std::string> splitList(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    out.push_back(item);
  return out;
}

/// Plan mode: replay each requested schedule, print them side by side.
static int runPlans(const std::vector<std::string> &paths,
                    const std::vector<std::string> &compare,
                    const PlanCluster &cluster, bool json) {
  std::vector<mapp::rt::Plan> plans;
  for (const std::string &path : paths) {
    try {
      plans.push_back(mapp::rt::loadPlan(path));
    } catch (const std::exception &e) {
      return fail(e.what());
    }
  }
  for (size_t i = 1; i < plans.size(); ++i)
    if (plans[i].worldSize != plans[0].worldSize ||
        plans[i].numMicrobatches != plans[0].numMicrobatches)
      return fail(paths[i] + ": world size / microbatches differ from " +
                  paths[0] + " (compare plans of one job)");
  std::vector<std::pair<std::string, size_t>> runs; // schedule, plan index
  if (compare.empty()) {
    for (size_t i = 0; i < plans.size(); ++i)
      runs.push_back({plans[i].schedule, i});
  } else {
    for (const std::string &name : compare) {
      size_t found = plans.size();
      std::string offered;
      for (size_t i = 0; i < plans.size() && found == plans.size(); ++i)
        for (const std::string &s : planSchedules(plans[i])) {
          offered += (offered.empty() ? "" : ", ") + s;
          if (s == name) {
            found = i;
            break;
          }
        }
      if (found == plans.size())
        return fail("no plan offers schedule '" + name + "' (the plans offer " +
                    offered + ")");
      runs.push_back({name, found});
    }
  }
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    const mapp::rt::Plan &p = plans[0];
    std::printf("mapp-sim: %d ranks (tp %d, pp %d, dp %d), %d microbatches, "
                "%d step(s)\n",
                p.worldSize, p.tp, p.pp, p.dp, p.numMicrobatches,
                cluster.steps);
    for (const Fault &f : cluster.faults)
      std::printf("  fault %s\n", f.text.c_str());
    std::printf("%-12s %12s %12s  %s\n", "schedule", "step_us",
                "peak_MiB", "per rank: peak MiB (in flight)");
  }
  for (auto &[name, pi] : runs) {
    PlanSimResult r;
    std::string err;
    if (!simulatePlan(plans[pi], name, cluster, r, &err))
      return fail(paths[pi] + ": " + err);
    uint64_t peak = *std::max_element(r.peakBytes.begin(), r.peakBytes.end());
    // Split plans: the peak of each side (a forward rank holds its
    // stage's parameters and one microbatch's working set).
    uint64_t sidePeak[2] = {0, 0}; // bwd, fwd
    for (size_t i = 0; i < r.roles.size(); ++i) {
      uint64_t &s = sidePeak[r.roles[i] == "fwd" ? 1 : 0];
      s = std::max(s, r.peakBytes[i]);
    }
    if (json) {
      nlohmann::json row = {{"schedule", r.schedule},
                            {"chosen", r.chosen},
                            {"reason", r.reason},
                            {"plan", paths[pi]},
                            {"step_us", r.stepUs},
                            {"peak_bytes", r.peakBytes},
                            {"peak_in_flight", r.peakInFlight}};
      if (r.schedule == "adaptive")
        row["peak_stash_bytes"] = r.peakStashBytes;
      if (!r.roles.empty()) {
        row["roles"] = r.roles;
        row["peak_bytes_bwd"] = sidePeak[0];
        row["peak_bytes_fwd"] = sidePeak[1];
        row["param_copy_bytes"] = r.paramCopyBytes;
        row["param_copy_host_bytes"] = r.stagingBytes;
      }
      out.push_back(row);
      continue;
    }
    std::printf("%-12s %12.3f %12.3f  ", name.c_str(), r.stepUs,
                peak / 1048576.0);
    for (size_t i = 0; i < r.peakBytes.size(); ++i)
      std::printf("%s%.3f (%lld)", i ? ", " : "", r.peakBytes[i] / 1048576.0,
                  (long long)r.peakInFlight[i]);
    std::printf("\n");
    if (!r.roles.empty())
      std::printf("%-12s fbd: peak MiB bwd side %.3f, fwd side %.3f; "
                  "parameter copy %llu B per step (coordinator %s)\n",
                  "", sidePeak[0] / 1048576.0, sidePeak[1] / 1048576.0,
                  (unsigned long long)r.paramCopyBytes,
                  cluster.fbdCoordinator ? "on" : "off");
    if (!r.reason.empty())
      std::printf("%-12s ran %s: %s\n", "", r.chosen.c_str(),
                  r.reason.c_str());
  }
  if (json)
    std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

int main(int argc, char **argv) {
  std::string config, outDir, whatIf, summariesOut;
  std::vector<std::string> inject;
  bool quiet = false, haveSeed = false, json = false;
  uint64_t seed = 0;
  std::vector<std::string> plans, compare;
  PlanCluster cluster;
  std::string err;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mapp-sim: error: %s needs a value\n%s", a.c_str(),
                     kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config" || a == "--cluster")
      config = next();
    else if (a == "-o")
      outDir = next();
    else if (a == "--summaries")
      summariesOut = next();
    else if (a == "--inject")
      inject.push_back(next());
    else if (a == "--what-if")
      whatIf = next();
    else if (a == "--seed") {
      std::string v = next();
      try {
        size_t used = 0;
        // stoull takes "-1" (as 2^64-1) and stops at "12abc": neither is a seed.
        if (v.empty() || v[0] == '-' || v[0] == '+')
          throw std::invalid_argument(v);
        seed = std::stoull(v, &used);
        if (used != v.size())
          throw std::invalid_argument(v);
        haveSeed = true;
      } catch (const std::exception &) {
        return fail("--seed expects an integer >= 0, got '" + v + "'");
      }
    } else if (a == "-q")
      quiet = true;
    else if (a == "--json")
      json = true;
    else if (a == "--compare") {
      compare = splitList(next());
      if (compare.empty())
        return fail("--compare expects a list like 1f1b,dfc,bfc,adaptive");
    } else if (a == "--steps") {
      double v;
      if (!number(a, next(), v, err) || v < 1 || v != (int)v)
        return fail(err.empty() ? "--steps expects an integer >= 1" : err);
      cluster.steps = int(v);
    } else if (a == "--gbps" || a == "--latency-us" || a == "--intra-gbps" ||
               a == "--intra-latency-us" || a == "--tflops" ||
               a == "--mem-gbps" || a == "--gpus-per-node" ||
               a == "--mem-cap") {
      double v;
      if (!number(a, next(), v, err))
        return fail(err);
      bool positive = a != "--latency-us" && a != "--intra-latency-us" &&
                      a != "--mem-cap";
      if (positive && v <= 0)
        return fail(a + " must be positive");
      if (a == "--gpus-per-node") {
        if (v != (int)v)
          return fail("--gpus-per-node expects an integer");
        cluster.gpusPerNode = int(v);
      } else if (a == "--mem-cap") {
        cluster.memCapBytes = uint64_t(v);
      } else {
        (a == "--gbps"               ? cluster.gbps
         : a == "--latency-us"       ? cluster.latencyUs
         : a == "--intra-gbps"       ? cluster.intraGbps
         : a == "--intra-latency-us" ? cluster.intraLatencyUs
         : a == "--tflops"           ? cluster.deviceTflops
                                     : cluster.memGBps) = v;
      }
    } else if (a == "--uniform-costs") {
      std::vector<std::string> c = splitList(next());
      std::vector<double> v(c.size());
      for (size_t k = 0; k < c.size(); ++k)
        if (!number(a, c[k], v[k], err))
          return fail(err);
      if (c.size() != 2 && c.size() != 4)
        return fail("--uniform-costs expects F,B or F,B,Bi,W (microseconds)");
      cluster.forwardUs = v[0];
      cluster.backwardUs = v[1];
      cluster.backwardInputUs = c.size() == 4 ? v[2] : v[1] / 2;
      cluster.backwardWeightUs = c.size() == 4 ? v[3] : v[1] / 2;
    }
    else if (a == "--profile") {
      mapp::cost::Profile prof;
      if (!mapp::cost::loadProfile(next(), prof, &err))
        return fail("--profile " + err);
      cluster.deviceTflops = prof.gemmTflopsF32 > 0 ? prof.gemmTflopsF32
                                                    : prof.gemmTflopsBf16;
      cluster.memGBps = prof.memGBps;
      cluster.opOverheadUs = prof.opOverheadUs;
      cluster.attentionEfficiency = prof.attentionEfficiency;
      cluster.intraGbps = prof.intra.gbps;
      cluster.intraLatencyUs = prof.intra.latencyUs;
      cluster.gbps = prof.inter.gbps;
      cluster.latencyUs = prof.inter.latencyUs;
    } else if (a == "--device-speed") {
      if (!parseDeviceSpeed(next(), cluster.deviceSpeed, &err))
        return fail(err);
    } else if (a.rfind("--coordinator=", 0) == 0) {
      std::string v = a.substr(a.find('=') + 1);
      if (v != "on" && v != "off")
        return fail("--coordinator expects on or off, got '" + v + "'");
      cluster.fbdCoordinator = v == "on";
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.size() > 6 && a.substr(a.size() - 6) == ".mplan")
      plans.push_back(a);
    else
      return fail("unknown argument '" + a + "'\n" + kUsage);
  }
  if (!plans.empty()) {
    if (!config.empty())
      return fail("give either --config or .mplan files, not both");
    int world = 0;
    try {
      world = mapp::rt::loadPlan(plans[0]).worldSize;
    } catch (const std::exception &e) {
      return fail(e.what());
    }
    for (const std::string &f : inject) {
      Fault fault;
      if (!parseFault(f, world, fault, &err))
        return fail(err);
      cluster.faults.push_back(fault);
    }
    return runPlans(plans, compare, cluster, json);
  }
  if (!compare.empty())
    return fail("--compare needs .mplan files");
  if (config.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string text, why;
  bool notRegular = false;
  if (!mapp::rt::readRegularFile(config, text, why, &notRegular))
    return fail(notRegular ? mapp::rt::openFailure("", config, why, true)
                           : config + ": cannot open (" + why + ")");
  SimConfig c;
  if (!parseSimConfig(text, c, &err))
    return fail(config + ": " + err);
  if (haveSeed)
    c.seed = seed;
  for (const std::string &f : inject) {
    Fault fault;
    if (!parseFault(f, c.tp * c.pp * c.dp, fault, &err))
      return fail(err);
    c.faults.push_back(fault);
  }

  if (!whatIf.empty()) {
    if (!mapp::rt::readRegularFile(whatIf, text, why, &notRegular))
      return fail(notRegular ? mapp::rt::openFailure("", whatIf, why, true)
                             : whatIf + ": cannot open (" + why + ")");
    nlohmann::json rep;
    try {
      rep = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception &e) {
      return fail(whatIf + ": invalid JSON: " + e.what());
    }
    // Remove the faults whose culprit the report names.
    SimConfig fixed = c;
    fixed.faults.clear();
    std::vector<std::string> removed;
    for (const Fault &f : c.faults) {
      bool named = false;
      for (const auto &x : rep.value("findings", nlohmann::json::array())) {
        std::string kind = x.value("kind", "");
        if (f.kind == Fault::SlowCompute && kind == "slow-rank")
          named |= x.value("rank", -1) == f.rank;
        if (f.kind != Fault::SlowCompute && kind == "slow-link")
          named |= x.value("src", -1) == f.src && x.value("dst", -1) == f.dst;
      }
      if (named)
        removed.push_back(f.text);
      else
        fixed.faults.push_back(f);
    }
    bool ok;
    double before = meanMs(c, ok, err);
    if (!ok)
      return fail(err);
    double after = meanMs(fixed, ok, err);
    if (!ok)
      return fail(err);
    std::printf("what-if: step %.3f ms -> %.3f ms with %zu fault(s) the "
                "report names removed: saves %.3f ms\n",
                before, after, removed.size(), before - after);
    for (const std::string &r : removed)
      std::printf("  removed %s\n", r.c_str());
    return 0;
  }

  SimJob job;
  SimTimes times;
  if (!buildSimJob(c, job, &err))
    return fail(err);
  if (!runSim(job, makeNetwork(c), times, &err))
    return fail(err);
  if (!summariesOut.empty()) {
    std::vector<mapp::monitor::StepSummary> recs;
    if (!simSummaries(c, job, times, recs, &err) ||
        !mapp::monitor::writeSummaries(summariesOut, recs, &err))
      return fail(err);
  }
  if (!outDir.empty() && !writeSimTraces(outDir, c, job, times, &err))
    return fail(err);
  if (!quiet) {
    std::vector<double> st = stepTimesNs(job, times);
    size_t events = 0;
    for (auto &p : job.programs)
      events += p.size();
    std::printf("mapp-sim: %d ranks (tp %d, pp %d, dp %d), schedule %s, "
                "%zu events, mean step %.3f ms\n",
                job.world, c.tp, c.pp, c.dp, c.schedule.c_str(), events,
                std::accumulate(st.begin(), st.end(), 0.0) / st.size() * 1e-6);
    for (const Fault &f : c.faults)
      std::printf("  fault %s\n", f.text.c_str());
  }
  return 0;
}

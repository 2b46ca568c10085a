//===- mapp-sim.cpp - Simulate a training job and write its traces --------===//
//
// mapp-sim --config job.json -o DIR [--inject FAULT]... [--seed S]
// mapp-sim --config job.json --what-if report.json [--inject FAULT]...
// See docs/mapp-sim.md.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Sim.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>

using namespace mapp::scan;

static const char *kUsage =
    "usage: mapp-sim --config job.json [-o DIR] [--inject FAULT]...\n"
    "                [--seed S] [--what-if report.json] [-q]\n"
    "  FAULT: slow-compute:rank=R,factor=F | link-delay:src=A,dst=B,us=U |\n"
    "         link-bandwidth:src=A,dst=B,gbps=G   (repeatable)\n"
    "  -o DIR           write DIR/rank-{r}.trace.jsonl and DIR/sim-truth.json\n"
    "  --what-if FILE   re-simulate with the culprits that a mapp-scan\n"
    "                   report names removed; print the step time saved\n";

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

int main(int argc, char **argv) {
  std::string config, outDir, whatIf;
  std::vector<std::string> inject;
  bool quiet = false, haveSeed = false;
  uint64_t seed = 0;
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
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.size() > 6 && a.substr(a.size() - 6) == ".mplan")
      return fail("reading schedules from a plan is not supported yet; "
                  "describe the job with --config");
    else
      return fail("unknown argument '" + a + "'\n" + kUsage);
  }
  if (config.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::ifstream in(config);
  if (!in)
    return fail(config + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  SimConfig c;
  std::string err;
  if (!parseSimConfig(ss.str(), c, &err))
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
    std::ifstream rin(whatIf);
    if (!rin)
      return fail(whatIf + ": cannot open");
    nlohmann::json rep;
    try {
      rin >> rep;
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

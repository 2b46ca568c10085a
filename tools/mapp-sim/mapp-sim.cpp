//===- mapp-sim.cpp - Simulate a training job and write its traces --------===//
//
// mapp-sim --config job.json -o DIR [--inject FAULT]... [--seed S]
// mapp-sim --config job.json --what-if report.json [--inject FAULT]...
// mapp-sim PLAN.mplan... [--compare S1,S2,...] [cluster options]
// See docs/mapp-sim.md.
//
//===----------------------------------------------------------------------===//

#include "mapp/cost/CostModel.h"
#include "mapp/scan/SimDriver.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

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

int main(int argc, char **argv) {
  SimRequest r;
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
      r.config = next();
    else if (a == "-o")
      r.outDir = next();
    else if (a == "--summaries")
      r.summariesOut = next();
    else if (a == "--inject")
      r.inject.push_back(next());
    else if (a == "--what-if")
      r.whatIf = next();
    else if (a == "--seed") {
      std::string v = next();
      try {
        size_t used = 0;
        // stoull takes "-1" (as 2^64-1) and stops at "12abc": neither is a
        // seed.
        if (v.empty() || v[0] == '-' || v[0] == '+')
          throw std::invalid_argument(v);
        r.seed = std::stoull(v, &used);
        if (used != v.size())
          throw std::invalid_argument(v);
        r.haveSeed = true;
      } catch (const std::exception &) {
        return fail("--seed expects an integer >= 0, got '" + v + "'");
      }
    } else if (a == "-q")
      r.quiet = true;
    else if (a == "--json")
      r.json = true;
    else if (a == "--compare") {
      r.compare = splitList(next());
      if (r.compare.empty())
        return fail("--compare expects a list like 1f1b,dfc,bfc,adaptive");
    } else if (a == "--steps") {
      double v;
      if (!number(a, next(), v, err) || v < 1 || v != (int)v)
        return fail(err.empty() ? "--steps expects an integer >= 1" : err);
      r.cluster.steps = int(v);
    } else if (a == "--gbps" || a == "--latency-us" || a == "--intra-gbps" ||
               a == "--intra-latency-us" || a == "--tflops" ||
               a == "--mem-gbps" || a == "--gpus-per-node" ||
               a == "--mem-cap") {
      double v;
      if (!number(a, next(), v, err))
        return fail(err);
      bool positive =
          a != "--latency-us" && a != "--intra-latency-us" && a != "--mem-cap";
      if (positive && v <= 0)
        return fail(a + " must be positive");
      if (a == "--gpus-per-node") {
        if (v != (int)v)
          return fail("--gpus-per-node expects an integer");
        r.cluster.gpusPerNode = int(v);
      } else if (a == "--mem-cap") {
        r.cluster.memCapBytes = uint64_t(v);
      } else {
        (a == "--gbps"               ? r.cluster.gbps
         : a == "--latency-us"       ? r.cluster.latencyUs
         : a == "--intra-gbps"       ? r.cluster.intraGbps
         : a == "--intra-latency-us" ? r.cluster.intraLatencyUs
         : a == "--tflops"           ? r.cluster.deviceTflops
                                     : r.cluster.memGBps) = v;
      }
    } else if (a == "--uniform-costs") {
      std::vector<std::string> c = splitList(next());
      std::vector<double> v(c.size());
      for (size_t k = 0; k < c.size(); ++k)
        if (!number(a, c[k], v[k], err))
          return fail(err);
      if (c.size() != 2 && c.size() != 4)
        return fail("--uniform-costs expects F,B or F,B,Bi,W (microseconds)");
      r.cluster.forwardUs = v[0];
      r.cluster.backwardUs = v[1];
      r.cluster.backwardInputUs = c.size() == 4 ? v[2] : v[1] / 2;
      r.cluster.backwardWeightUs = c.size() == 4 ? v[3] : v[1] / 2;
    } else if (a == "--profile") {
      mapp::cost::Profile prof;
      if (!mapp::cost::loadProfile(next(), prof, &err))
        return fail("--profile " + err);
      r.cluster.deviceTflops =
          prof.gemmTflopsF32 > 0 ? prof.gemmTflopsF32 : prof.gemmTflopsBf16;
      r.cluster.gemmRates =
          prof.gemmTflopsF32 > 0 ? prof.gemmRatesF32 : prof.gemmRatesBf16;
      r.cluster.memGBps = prof.memGBps;
      r.cluster.activationGelems = prof.activationGelems;
      r.cluster.opOverheadUs = prof.opOverheadUs;
      r.cluster.attentionEfficiency = prof.attentionEfficiency;
      r.cluster.intraGbps = prof.intra.gbps;
      r.cluster.intraLatencyUs = prof.intra.latencyUs;
      r.cluster.gbps = prof.inter.gbps;
      r.cluster.latencyUs = prof.inter.latencyUs;
    } else if (a == "--device-speed") {
      if (!parseDeviceSpeed(next(), r.cluster.deviceSpeed, &err))
        return fail(err);
    } else if (a.rfind("--coordinator=", 0) == 0) {
      std::string v = a.substr(a.find('=') + 1);
      if (v != "on" && v != "off")
        return fail("--coordinator expects on or off, got '" + v + "'");
      r.cluster.fbdCoordinator = v == "on";
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.size() > 6 && a.substr(a.size() - 6) == ".mplan")
      r.plans.push_back(a);
    else
      return fail("unknown argument '" + a + "'\n" + kUsage);
  }
  if (r.plans.empty() && r.compare.empty() && r.config.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  return runSimRequest(r, &err) ? 0 : fail(err);
}

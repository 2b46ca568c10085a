//===- SimDriver.cpp - mapp-sim's two modes as library functions ----------===//
//
// Plan mode (replay .mplan schedules side by side) and config mode (simulate
// a job, write its traces and summaries, or a what-if against a mapp-scan
// report). tools/mapp-sim parses the flags and calls runSimRequest.
// See docs/mapp-sim.md.
//
//===----------------------------------------------------------------------===//
#include "mapp/scan/SimDriver.h"
#include "mapp/rt/RegularFile.h"
#include "mapp/scan/Sim.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>

using namespace mapp::scan;

namespace {

bool failWith(std::string *err, const std::string &msg) {
  if (err)
    *err = msg;
  return false;
}

double meanMs(const SimConfig &c, bool &ok, std::string &err) {
  SimJob job;
  SimTimes times;
  ok = buildSimJob(c, job, &err) && runSim(job, makeNetwork(c), times, &err);
  if (!ok)
    return 0;
  std::vector<double> st = stepTimesNs(job, times);
  return std::accumulate(st.begin(), st.end(), 0.0) / st.size() * 1e-6;
}

/// Plan mode: replay each requested schedule, print them side by side.
bool comparePlans(const std::vector<std::string> &paths,
                  const std::vector<std::string> &compare,
                  const PlanCluster &cluster, bool json, std::string *err) {
  std::vector<mapp::rt::Plan> plans;
  for (const std::string &path : paths) {
    try {
      plans.push_back(mapp::rt::loadPlan(path));
    } catch (const std::exception &e) {
      return failWith(err, e.what());
    }
  }
  for (size_t i = 1; i < plans.size(); ++i)
    if (plans[i].worldSize != plans[0].worldSize ||
        plans[i].numMicrobatches != plans[0].numMicrobatches)
      return failWith(err, paths[i] +
                               ": world size / microbatches differ from " +
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
        return failWith(err, "no plan offers schedule '" + name +
                                 "' (the plans offer " + offered + ")");
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
    std::printf("%-12s %12s %12s  %s\n", "schedule", "step_us", "peak_MiB",
                "per rank: peak MiB (in flight)");
  }
  for (auto &[name, pi] : runs) {
    PlanSimResult r;
    std::string why;
    if (!simulatePlan(plans[pi], name, cluster, r, &why))
      return failWith(err, paths[pi] + ": " + why);
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
      std::printf("%-12s ran %s: %s\n", "", r.chosen.c_str(), r.reason.c_str());
  }
  if (json)
    std::printf("%s\n", out.dump(1).c_str());
  return true;
}

} // namespace

bool mapp::scan::runSimRequest(const SimRequest &r, std::string *err) {
  std::string why;
  if (!r.plans.empty()) {
    if (!r.config.empty())
      return failWith(err, "give either --config or .mplan files, not both");
    PlanCluster cluster = r.cluster;
    int world = 0;
    try {
      world = mapp::rt::loadPlan(r.plans[0]).worldSize;
    } catch (const std::exception &e) {
      return failWith(err, e.what());
    }
    for (const std::string &f : r.inject) {
      Fault fault;
      if (!parseFault(f, world, fault, &why))
        return failWith(err, why);
      cluster.faults.push_back(fault);
    }
    return comparePlans(r.plans, r.compare, cluster, r.json, err);
  }
  if (!r.compare.empty())
    return failWith(err, "--compare needs .mplan files");
  std::string text;
  bool notRegular = false;
  if (!mapp::rt::readRegularFile(r.config, text, why, &notRegular))
    return failWith(err, notRegular
                             ? mapp::rt::openFailure("", r.config, why, true)
                             : r.config + ": cannot open (" + why + ")");
  SimConfig c;
  if (!parseSimConfig(text, c, &why))
    return failWith(err, r.config + ": " + why);
  if (r.haveSeed)
    c.seed = r.seed;
  for (const std::string &f : r.inject) {
    Fault fault;
    if (!parseFault(f, c.tp * c.pp * c.dp, fault, &why))
      return failWith(err, why);
    c.faults.push_back(fault);
  }

  if (!r.whatIf.empty()) {
    if (!mapp::rt::readRegularFile(r.whatIf, text, why, &notRegular))
      return failWith(err, notRegular
                               ? mapp::rt::openFailure("", r.whatIf, why, true)
                               : r.whatIf + ": cannot open (" + why + ")");
    nlohmann::json rep;
    try {
      rep = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception &e) {
      return failWith(err, r.whatIf + ": invalid JSON: " + e.what());
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
    double before = meanMs(c, ok, why);
    if (!ok)
      return failWith(err, why);
    double after = meanMs(fixed, ok, why);
    if (!ok)
      return failWith(err, why);
    std::printf("what-if: step %.3f ms -> %.3f ms with %zu fault(s) the "
                "report names removed: saves %.3f ms\n",
                before, after, removed.size(), before - after);
    for (const std::string &name : removed)
      std::printf("  removed %s\n", name.c_str());
    return true;
  }

  SimJob job;
  SimTimes times;
  if (!buildSimJob(c, job, &why))
    return failWith(err, why);
  if (!runSim(job, makeNetwork(c), times, &why))
    return failWith(err, why);
  if (!r.summariesOut.empty()) {
    std::vector<mapp::monitor::StepSummary> recs;
    if (!simSummaries(c, job, times, recs, &why) ||
        !mapp::monitor::writeSummaries(r.summariesOut, recs, &why))
      return failWith(err, why);
  }
  if (!r.outDir.empty() && !writeSimTraces(r.outDir, c, job, times, &why))
    return failWith(err, why);
  if (!r.quiet) {
    std::vector<double> st = stepTimesNs(job, times);
    size_t events = 0;
    for (auto &p : job.programs)
      events += p.size();
    std::printf("mapp-sim: %d ranks (tp %d, pp %d, dp %d), schedule %s, "
                "%zu events, mean step %.3f ms\n",
                job.world, c.tp, c.pp, c.dp, c.schedule.c_str(), events,
                std::accumulate(st.begin(), st.end(), 0.0) / st.size() * 1e-6);
    if (c.cp > 1 || c.attentionForwardNs() > 0) {
      // The cp class of the exposure truth, as ms per step over the ranks.
      nlohmann::json ex = simExposureTruth(job, times);
      double exposed = 0;
      for (const auto &rk : ex["ranks"])
        if (rk["classes"].contains("cp"))
          exposed += rk["classes"]["cp"].value("exposed_ms_per_step", 0.0);
      // The transfers' own time: a ring send's time on its link (the send
      // itself does not wait), an all-to-all's span.
      SimNetwork net = makeNetwork(c);
      double xferNs = 0;
      for (int rk = 0; rk < job.world; ++rk)
        for (size_t i = 0; i < job.programs[rk].size(); ++i) {
          const SimOp &op = job.programs[rk][i];
          if (op.group < 0 || job.groups[op.group].kind != "cp")
            continue;
          if (op.kind == SimOp::Send)
            xferNs += net.p2p(rk, op.peer, op.bytes);
          else if (op.kind == SimOp::Coll)
            xferNs += times.ops[rk][i].second - times.ops[rk][i].first;
        }
      std::printf("mapp-sim: cp %d (%s), sequence %lld: cp transfers %.3f "
                  "ms per step, exposed %.3f ms (mean over ranks)\n",
                  c.cp, c.cpComm.c_str(), (long long)c.seqLen,
                  xferNs * 1e-6 / c.steps / job.world, exposed / job.world);
    }
    if (!job.peakBytes.empty()) {
      auto top = std::max_element(job.peakBytes.begin(), job.peakBytes.end());
      std::printf("mapp-sim: peak memory %.3f GiB per rank (rank %d)\n",
                  *top / 1073741824.0, int(top - job.peakBytes.begin()));
    }
    for (const Fault &f : c.faults)
      std::printf("  fault %s\n", f.text.c_str());
  }
  return true;
}

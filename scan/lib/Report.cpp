//===- Report.cpp - report.json and the text summary ----------------------===//

#include "mapp/scan/Report.h"
#include "mapp/scan/AllToAllLoad.h"
#include "mapp/scan/Decisions.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

using namespace mapp::scan;
using json = nlohmann::json;

static double perStep(const ScanResult &s, double ns) {
  return ns * 1e-6 / std::max(1, s.diag.steps);
}

void mapp::scan::withholdFindings(ScanResult &s) {
  if (s.consistency.consistent())
    return;
  s.withheld = std::move(s.diag.findings);
  s.diag.findings.clear();
}

static json findingJson(const Trace &t, const Finding &f) {
  json x = {{"kind", f.kind},
            {"confidence", f.confidence},
            {"ratio", f.ratio},
            {"magnitude", f.magnitude},
            {"evidence", f.evidence}};
  if (f.aboutRank()) {
    x["rank"] = f.rank;
    x["label"] = t.rankLabel(f.rank);
    x["victims"] = f.victims;
    if (!f.members.empty()) {
      x["ep_group"] = f.members;
      x["ep_member"] = std::find(f.members.begin(), f.members.end(), f.rank) -
                       f.members.begin();
      x["recv_bytes_per_member"] = f.memberBytes;
    }
  } else {
    x["src"] = f.src;
    x["dst"] = f.dst;
    x["link"] = {f.src, f.dst};
  }
  return x;
}

namespace mon = mapp::monitor;

// Exposed communication per rank and class, and the critical path; per
// step means are over the steps with events (ExposureAnalysis::stepIds).
static json exposureJson(const ScanResult &s) {
  const Trace &t = s.trace;
  const ExposureAnalysis &a = s.exposure;
  double steps = std::max<size_t>(1, a.stepIds.size());
  double stepNs = 0;
  for (const CriticalPathStep &p : a.path)
    stepNs += p.stepNs;
  stepNs /= steps;
  auto ms = [&](double ns) { return ns / steps * 1e-6; };
  json ranks = json::array();
  double sumExposed = 0, sumComm = 0, maxExposed = -1;
  int maxRank = -1;
  double clsExposed[mon::kCommClasses] = {}, clsComm[mon::kCommClasses] = {};
  double clsMax[mon::kCommClasses] = {};
  int clsMaxRank[mon::kCommClasses];
  std::fill(std::begin(clsMaxRank), std::end(clsMaxRank), -1);
  for (const RankExposure &r : a.ranks) {
    json cls = json::object();
    for (int c = 0; c < mon::kCommClasses; ++c) {
      const ClassExposure &ce = r.cls[c];
      if (!ce.events)
        continue;
      cls[mon::commClassName(c)] = {{"exposed_ms_per_step", ms(ce.exposedNs)},
                                    {"comm_ms_per_step", ms(ce.commNs)},
                                    {"events", ce.events}};
      clsExposed[c] += ce.exposedNs;
      clsComm[c] += ce.commNs;
      if (clsMaxRank[c] < 0 || ce.exposedNs > clsMax[c]) {
        clsMax[c] = ce.exposedNs;
        clsMaxRank[c] = r.rank;
      }
    }
    json perStep = json::array();
    for (double v : r.stepExposedNs)
      perStep.push_back(v * 1e-6);
    ranks.push_back({{"rank", r.rank},
                     {"label", t.rankLabel(r.rank)},
                     {"exposed_ms_per_step", ms(r.exposedNs)},
                     {"comm_ms_per_step", ms(r.commNs)},
                     {"fraction_of_step",
                      stepNs > 0 ? r.exposedNs / steps / stepNs : 0.0},
                     {"per_step_ms", perStep},
                     {"classes", cls}});
    sumExposed += r.exposedNs;
    sumComm += r.commNs;
    if (r.exposedNs > maxExposed) {
      maxExposed = r.exposedNs;
      maxRank = r.rank;
    }
  }
  double world = std::max(1, t.world);
  json byClass = json::object();
  for (int c = 0; c < mon::kCommClasses; ++c) {
    if (clsMaxRank[c] < 0)
      continue;
    byClass[mon::commClassName(c)] = {
        {"exposed_ms_per_step", ms(clsExposed[c]) / world},
        {"comm_ms_per_step", ms(clsComm[c]) / world},
        {"hidden_fraction",
         clsComm[c] > 0 ? 1 - clsExposed[c] / clsComm[c] : 0.0},
        {"max_rank", clsMaxRank[c]},
        {"max_exposed_ms_per_step", ms(clsMax[c])}};
  }
  json perStep = json::array();
  for (size_t k = 0; k < a.stepIds.size(); ++k) {
    double sum = 0;
    for (const RankExposure &r : a.ranks)
      sum += r.stepExposedNs[k];
    perStep.push_back(sum / world * 1e-6);
  }
  // The critical path, per step mean and per step.
  CriticalPathStep mean;
  json pathSteps = json::array();
  for (const CriticalPathStep &p : a.path) {
    mean.stepNs += p.stepNs;
    mean.computeNs += p.computeNs;
    mean.otherNs += p.otherNs;
    json pc = json::object();
    for (int c = 0; c < mon::kCommClasses; ++c) {
      mean.commNs[c] += p.commNs[c];
      if (p.commNs[c] > 0)
        pc[mon::commClassName(c)] = p.commNs[c] * 1e-6;
    }
    pathSteps.push_back({{"step", p.step},
                         {"step_ms", p.stepNs * 1e-6},
                         {"compute_ms", p.computeNs * 1e-6},
                         {"comm_ms", p.totalCommNs() * 1e-6},
                         {"comm_by_class_ms", pc},
                         {"other_ms", p.otherNs * 1e-6},
                         {"end_rank", p.endRank},
                         {"rank_switches", p.rankSwitches}});
  }
  json pathClasses = json::object();
  for (int c = 0; c < mon::kCommClasses; ++c)
    if (mean.commNs[c] > 0)
      pathClasses[mon::commClassName(c)] = ms(mean.commNs[c]);
  double exposedMean = sumExposed / world / steps;
  return {{"definition",
           "time in a communication event with none of the rank's compute "
           "beside it (on any of its streams), per step"},
          {"steps", a.stepIds.size()},
          {"step_ms", stepNs * 1e-6},
          {"exposed_ms_per_step", exposedMean * 1e-6},
          {"comm_ms_per_step", ms(sumComm) / world},
          {"fraction_of_step", stepNs > 0 ? exposedMean / stepNs : 0.0},
          {"max_rank", maxRank},
          {"max_exposed_ms_per_step", maxRank < 0 ? 0.0 : ms(maxExposed)},
          {"per_step_ms", perStep},
          {"by_class", byClass},
          {"ranks", ranks},
          {"critical_path",
           {{"step_ms", ms(mean.stepNs)},
            {"compute_ms", ms(mean.computeNs)},
            {"comm_ms", ms(mean.totalCommNs())},
            {"other_ms", ms(mean.otherNs)},
            {"comm_fraction",
             mean.stepNs > 0 ? mean.totalCommNs() / mean.stepNs : 0.0},
            {"comm_by_class_ms", pathClasses},
            {"per_step", pathSteps}}}};
}

static json classStatsJson(const ScanResult &s) {
  json out = json::array();
  for (const ClassStats &c : s.classes) {
    json ranks = json::array();
    for (const RankClassStats &r : c.ranks)
      ranks.push_back({{"rank", r.rank},
                       {"events", r.events},
                       {"min_ms", r.minNs * 1e-6},
                       {"max_ms", r.maxNs * 1e-6},
                       {"mean_ms", r.meanNs * 1e-6},
                       {"p95_ms", r.p95Ns * 1e-6},
                       {"ms_per_step", r.perStepNs * 1e-6}});
    json x = {{"class", c.name},
              {"comm", c.comm},
              {"slowest_rank", c.slowestRank},
              {"slowest_label", s.trace.rankLabel(c.slowestRank)},
              {"slowest_ratio", c.slowestRatio},
              {"ranks", ranks}};
    if (c.comm) {
      x["waited_for_rank"] = c.lateRank;
      x["waited_for_ms_per_step"] = c.lateNsPerStep * 1e-6;
    }
    out.push_back(x);
  }
  return out;
}

json mapp::scan::reportJson(const ScanResult &s) {
  const Trace &t = s.trace;
  json j;
  j["version"] = 1;
  j["world"] = t.world;
  j["dims"] = {{"tp", t.tp}, {"pp", t.pp}, {"dp", t.dp}};
  j["steps"] = s.diag.steps;
  json st = json::array();
  for (double v : s.diag.stepNs)
    st.push_back(v * 1e-6);
  double mean =
      s.diag.stepNs.empty()
          ? 0
          : std::accumulate(s.diag.stepNs.begin(), s.diag.stepNs.end(), 0.0) /
                s.diag.stepNs.size();
  j["step_time_ms"] = {{"mean", mean * 1e-6}, {"per_step", st}};

  json findings = json::array(), withheld = json::array();
  for (const Finding &f : s.diag.findings)
    findings.push_back(findingJson(t, f));
  for (const Finding &f : s.withheld)
    withheld.push_back(findingJson(t, f));
  j["findings"] = findings;
  j["consistent"] = s.consistency.consistent();
  j["inconsistencies"] = s.consistency.problems;
  if (!s.withheld.empty())
    j["withheld_findings"] = withheld;

  json ranks = json::array();
  for (const RankStats &r : s.diag.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"label", t.rankLabel(r.rank)},
                     {"host", t.ranks[r.rank].hdr.host},
                     {"compute_ms_per_step", perStep(s, r.computeNs)},
                     {"comm_ms_per_step", perStep(s, r.commNs)},
                     {"wait_ms_per_step", perStep(s, r.waitNs)},
                     {"idle_ms_per_step", perStep(s, r.idleNs)},
                     {"compute_ratio", r.computeRatio},
                     {"slower_op_fraction", r.consistency},
                     {"kind_ratio_lower_quartile", r.kindRatioLowerQuartile},
                     {"compared_ops", r.compared},
                     {"off_cpu_fraction", r.offCpuFraction}});
  j["ranks"] = ranks;
  json links = json::array();
  for (const LinkStats &l : s.diag.links)
    links.push_back({{"src", l.src},
                     {"dst", l.dst},
                     {"intra_host", l.intraHost},
                     {"messages", l.messages},
                     {"bytes", l.bytes},
                     {"effective_gbps", l.gbps},
                     {"transfer_us", l.transferNs * 1e-3},
                     {"slow_step_fraction", l.slowStepFraction},
                     {"class_links", l.peers},
                     {"ratio", l.ratio}});
  j["links"] = links;
  json a2a = json::array();
  for (const AllToAllLoad &l : allToAllLoads(t))
    a2a.push_back({{"rank", l.rank},
                   {"name", l.name},
                   {"members", l.members},
                   {"events", l.events},
                   {"send_bytes", l.sendBytes},
                   {"recv_bytes", l.recvBytes},
                   {"recv_max_over_mean", l.recvImbalance},
                   {"send_max_over_mean", l.sendImbalance}});
  j["all_to_all_bytes_per_peer"] = a2a;
  j["exposed_comm"] = exposureJson(s);
  j["event_classes"] = classStatsJson(s);

  const AlignResult &a = s.align;
  json clocks = json::array();
  for (int r = 0; r < t.world; ++r) {
    const RankClock &c = a.clocks[r];
    clocks.push_back({{"rank", r},
                      {"origin_ns", c.originNs},
                      {"offset_ns", c.offsetNs},
                      {"drift_ppm", c.driftPpm},
                      {"anchors", c.anchors},
                      {"residual_rms_ns", c.collRmsNs},
                      {"residual_max_ns", c.collMaxNs}});
  }
  j["alignment"] = {{"method", a.method},
                    {"mapping",
                     "global_ns = (local_ns - origin_ns) * (1 + drift_ppm*1e-6)"
                     " + offset_ns; global time is rank 0's clock"},
                    {"collective_anchors", a.collAnchors},
                    {"p2p_pairs", a.p2pPairs},
                    {"ntp_equations", a.ntpEquations},
                    {"components", a.components},
                    {"shared_host_clocks", a.sharedClocks},
                    {"residual_rms_ns", a.collRmsNs},
                    {"residual_max_ns", a.collMaxNs},
                    {"p2p_violations_before_repair", a.violationsBefore},
                    {"p2p_violations_after_repair", a.violationsAfter},
                    {"repair_rounds", a.repairRounds},
                    {"ranks", clocks}};
  j["matching"] = {{"p2p_pairs", s.matches.p2p.size()},
                   {"collectives", s.matches.colls.size()},
                   {"unmatched_sends", s.matches.unmatchedSends},
                   {"unmatched_recvs", s.matches.unmatchedRecvs},
                   {"incomplete_collectives", s.matches.incompleteColls}};
  j["compute_clock"] = s.diag.cpuClock ? "thread-cpu" : "span";
  json warnings = t.warnings;
  for (const std::string &w : s.diag.warnings)
    warnings.push_back(w);
  j["warnings"] = warnings;
  if (s.haveWhatIf) {
    const WhatIfResult &w = s.whatIf;
    j["what_if"] = {{"measured_step_ms", w.measuredStepMs},
                    {"replay_step_ms", w.replayStepMs},
                    {"repaired_step_ms", w.repairedStepMs},
                    {"saved_ms", w.savedMs},
                    {"saved_pct", w.savedPct},
                    {"repaired", w.repaired}};
  }
  if (!s.decisions.empty())
    j["elastic_decisions"] = s.decisions;
  return j;
}

// Two lines: exposed communication per rank and step (share of the step,
// per class, the most exposed rank) and the critical path's split.
static std::string exposureText(const ScanResult &s) {
  const ExposureAnalysis &a = s.exposure;
  if (a.stepIds.empty())
    return "";
  double steps = a.stepIds.size(), world = std::max(1, s.trace.world);
  double stepNs = 0, exposed = 0, comm = 0, most = -1;
  int mostRank = -1;
  double cls[mon::kCommClasses] = {}, clsComm[mon::kCommClasses] = {};
  for (const CriticalPathStep &p : a.path)
    stepNs += p.stepNs / steps;
  for (const RankExposure &r : a.ranks) {
    exposed += r.exposedNs / steps / world;
    comm += r.commNs / steps / world;
    for (int c = 0; c < mon::kCommClasses; ++c) {
      cls[c] += r.cls[c].exposedNs / steps / world;
      clsComm[c] += r.cls[c].commNs;
    }
    if (r.exposedNs > most) {
      most = r.exposedNs;
      mostRank = r.rank;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "exposed comm: %.3f ms per rank and step, %.1f%% of the "
                "%.3f ms step (comm %.3f ms, %.0f%% hidden)",
                exposed * 1e-6, stepNs > 0 ? 100 * exposed / stepNs : 0.0,
                stepNs * 1e-6, comm * 1e-6,
                comm > 0 ? 100 * (1 - exposed / comm) : 0.0);
  std::string out = buf;
  std::string parts;
  for (int c = 0; c < mon::kCommClasses; ++c) {
    if (clsComm[c] <= 0)
      continue;
    std::snprintf(buf, sizeof buf, "%s%s %.3f", parts.empty() ? "" : ", ",
                  mon::commClassName(c), cls[c] * 1e-6);
    parts += buf;
  }
  if (!parts.empty())
    out += ": " + parts;
  if (mostRank >= 0) {
    std::snprintf(buf, sizeof buf, "; most exposed: rank %d (%s) %.3f ms",
                  mostRank, s.trace.rankLabel(mostRank).c_str(),
                  most / steps * 1e-6);
    out += buf;
  }
  out += "\n";
  CriticalPathStep m;
  for (const CriticalPathStep &p : a.path) {
    m.stepNs += p.stepNs / steps;
    m.computeNs += p.computeNs / steps;
    m.otherNs += p.otherNs / steps;
    for (int c = 0; c < mon::kCommClasses; ++c)
      m.commNs[c] += p.commNs[c] / steps;
  }
  double total = m.stepNs > 0 ? m.stepNs : 1;
  std::snprintf(buf, sizeof buf,
                "critical path: compute %.3f ms (%.1f%%), comm %.3f ms "
                "(%.1f%%",
                m.computeNs * 1e-6, 100 * m.computeNs / total,
                m.totalCommNs() * 1e-6, 100 * m.totalCommNs() / total);
  out += buf;
  parts.clear();
  for (int c = 0; c < mon::kCommClasses; ++c) {
    if (m.commNs[c] <= 0)
      continue;
    std::snprintf(buf, sizeof buf, "%s%s %.3f", parts.empty() ? ": " : ", ",
                  mon::commClassName(c), m.commNs[c] * 1e-6);
    parts += buf;
  }
  std::snprintf(buf, sizeof buf, "), other %.3f ms (%.1f%%)\n",
                m.otherNs * 1e-6, 100 * m.otherNs / total);
  return out + parts + buf;
}

// One line per event class: the slowest rank and the spread of the ranks.
static std::string classStatsText(const ScanResult &s) {
  std::string out;
  char buf[384];
  for (const ClassStats &c : s.classes) {
    double lo = 1e300, hi = 0, p95 = 0, slowest = 0;
    for (const RankClassStats &r : c.ranks) {
      lo = std::min(lo, r.meanNs);
      hi = std::max(hi, r.meanNs);
      p95 = std::max(p95, r.p95Ns);
      if (r.rank == c.slowestRank)
        slowest = r.perStepNs;
    }
    std::snprintf(buf, sizeof buf,
                  "class %s: slowest rank %d (%s) %.3f ms/step, %.2fx the "
                  "median rank; mean per event %.3f..%.3f ms over %zu ranks, "
                  "p95 up to %.3f ms",
                  c.name.c_str(), c.slowestRank,
                  s.trace.rankLabel(c.slowestRank).c_str(), slowest * 1e-6,
                  c.slowestRatio, lo * 1e-6, hi * 1e-6, c.ranks.size(),
                  p95 * 1e-6);
    out += buf;
    if (c.lateRank >= 0) {
      std::snprintf(buf, sizeof buf, "; waited for: rank %d %.3f ms/step",
                    c.lateRank, c.lateNsPerStep * 1e-6);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

std::string mapp::scan::textSummary(const ScanResult &s) {
  const Trace &t = s.trace;
  std::string out;
  char buf[512];
  double mean =
      s.diag.stepNs.empty()
          ? 0
          : std::accumulate(s.diag.stepNs.begin(), s.diag.stepNs.end(), 0.0) /
                s.diag.stepNs.size();
  std::snprintf(buf, sizeof(buf),
                "mapp-scan: %d ranks (tp %d, pp %d, dp %d), %d steps, mean "
                "step %.3f ms\n",
                t.world, t.tp, t.pp, t.dp, s.diag.steps, mean * 1e-6);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "alignment: %s; %zu collective anchors, residual rms %.0f ns "
                "max %.0f ns; p2p violations %zu -> %zu\n",
                s.align.method.c_str(), s.align.collAnchors, s.align.collRmsNs,
                s.align.collMaxNs, s.align.violationsBefore,
                s.align.violationsAfter);
  out += buf;
  for (const std::string &w : t.warnings)
    out += "warning: " + w + "\n";
  for (const std::string &w : s.diag.warnings)
    out += "warning: " + w + "\n";
  for (const std::string &p : s.consistency.problems)
    out += "inconsistent: " + p + "\n";
  if (!s.consistency.consistent() && s.diag.findings.empty())
    out += "findings: withheld, the data is inconsistent (" +
           std::to_string(s.withheld.size()) +
           " set aside; --allow-inconsistent shows them)\n";
  else if (s.diag.findings.empty())
    out += "findings: none\n";
  for (const Finding &f : s.diag.findings) {
    if (f.aboutRank())
      std::snprintf(buf, sizeof(buf),
                    "finding: %s rank=%d (%s) confidence=%.2f: %s\n",
                    f.kind.c_str(), f.rank, t.rankLabel(f.rank).c_str(),
                    f.confidence, f.magnitude.c_str());
    else
      std::snprintf(buf, sizeof(buf),
                    "finding: slow-link src=%d dst=%d confidence=%.2f: %s\n",
                    f.src, f.dst, f.confidence, f.magnitude.c_str());
    out += buf;
  }
  for (const AllToAllLoad &l : allToAllLoads(t)) {
    auto list = [](const std::vector<uint64_t> &v) {
      std::string x = "[";
      for (size_t i = 0; i < v.size(); ++i)
        x += (i ? "," : "") + std::to_string(v[i]);
      return x + "]";
    };
    out += "all_to_all " + l.name + " rank " + std::to_string(l.rank) +
           " (" + std::to_string(l.events) + " events): recv bytes per peer " +
           list(l.recvBytes) + ", send " + list(l.sendBytes);
    std::snprintf(buf, sizeof(buf), "; recv max/mean %.2f\n",
                  l.recvImbalance);
    out += buf;
  }
  out += exposureText(s);
  out += classStatsText(s);
  for (const nlohmann::json &d : s.decisions)
    out += "elastic: " + decisionText(d) + "\n";
  if (s.haveWhatIf) {
    const WhatIfResult &w = s.whatIf;
    std::snprintf(buf, sizeof(buf),
                  "what-if: step %.3f ms (replay %.3f ms) -> %.3f ms with the "
                  "findings repaired: saves %.3f ms (%.1f%%)\n",
                  w.measuredStepMs, w.replayStepMs, w.repairedStepMs, w.savedMs,
                  w.savedPct);
    out += buf;
  }
  return out;
}

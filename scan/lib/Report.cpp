//===- Report.cpp - report.json and the text summary ----------------------===//

#include "mapp/scan/Report.h"
#include "mapp/scan/AllToAllLoad.h"

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
  if (f.kind == "slow-rank") {
    x["rank"] = f.rank;
    x["label"] = t.rankLabel(f.rank);
    x["victims"] = f.victims;
  } else {
    x["src"] = f.src;
    x["dst"] = f.dst;
    x["link"] = {f.src, f.dst};
  }
  return x;
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
  return j;
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
    if (f.kind == "slow-rank")
      std::snprintf(buf, sizeof(buf),
                    "finding: slow-rank rank=%d (%s) confidence=%.2f: %s\n",
                    f.rank, t.rankLabel(f.rank).c_str(), f.confidence,
                    f.magnitude.c_str());
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

//===- HtmlReport.cpp - Self-contained HTML report with inline SVG --------===//

#include "mapp/scan/Report.h"
#include "mapp/scan/Decisions.h"

#include <cmath>
#include <cstdio>
#include <fstream>

using namespace mapp::scan;

namespace {
std::string h(const std::string &s) {
  std::string o;
  for (char c : s) {
    switch (c) {
    case '<':
      o += "&lt;";
      break;
    case '>':
      o += "&gt;";
      break;
    case '&':
      o += "&amp;";
      break;
    case '"':
      o += "&quot;";
      break;
    default:
      o += c;
    }
  }
  return o;
}

std::string f(const char *fmt, double a, double b = 0, double c = 0,
              double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, a, b, c, d);
  return buf;
}

const char *kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#bab0ac"};

// Stacked bars: compute / comm / wait / idle per rank, ms per step.
std::string breakdownSvg(const ScanResult &s) {
  const auto &rs = s.diag.ranks;
  double steps = std::max(1, s.diag.steps), maxv = 1e-9;
  for (const RankStats &r : rs)
    maxv = std::max(maxv, (r.computeNs + r.commNs + r.waitNs + r.idleNs) /
                              steps * 1e-6);
  int barH = 16, W = 640, left = 120;
  int H = rs.size() * (barH + 4) + 40;
  std::string o = "<svg width=\"" + std::to_string(W + left + 20) +
                  "\" height=\"" + std::to_string(H) + "\">";
  std::set<int> culprits;
  for (const Finding &fd : s.diag.findings)
    if (fd.aboutRank())
      culprits.insert(fd.rank);
  for (size_t i = 0; i < rs.size(); ++i) {
    const RankStats &r = rs[i];
    double v[4] = {r.computeNs, r.commNs, r.waitNs, r.idleNs};
    int y = 10 + i * (barH + 4);
    double x = left;
    o += "<text x=\"4\" y=\"" + std::to_string(y + 12) + "\"" +
         (culprits.count(r.rank) ? " fill=\"#c00\" font-weight=\"bold\"" : "") +
         ">" + std::to_string(r.rank) + " " + h(s.trace.rankLabel(r.rank)) +
         "</text>";
    for (int k = 0; k < 4; ++k) {
      double ms = v[k] / steps * 1e-6, w = ms / maxv * W;
      o += "<rect x=\"" + f("%.1f", x) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + f("%.1f", w) + "\" height=\"" +
           std::to_string(barH) + "\" fill=\"" + kColors[k] + "\"><title>" +
           f("%.3f ms", ms) + "</title></rect>";
      x += w;
    }
  }
  const char *names[] = {"compute", "comm (transfer)", "wait", "idle"};
  for (int k = 0; k < 4; ++k)
    o += "<rect x=\"" + std::to_string(left + k * 150) + "\" y=\"" +
         std::to_string(H - 18) + "\" width=\"12\" height=\"12\" fill=\"" +
         kColors[k] + "\"/><text x=\"" + std::to_string(left + k * 150 + 16) +
         "\" y=\"" + std::to_string(H - 8) + "\">" + names[k] + "</text>";
  return o + "</svg>";
}

// src x dst grid coloured by median effective bandwidth.
std::string heatmapSvg(const ScanResult &s) {
  int R = s.trace.world;
  if (s.diag.links.empty())
    return "<p>No point-to-point transfers in the trace.</p>";
  if (R > 64)
    return "<p>World too large for a grid; see the links table.</p>";
  double maxbw = 1e-9;
  for (const LinkStats &l : s.diag.links)
    maxbw = std::max(maxbw, l.gbps);
  int c = std::max(10, std::min(36, 560 / R)), off = 40;
  int size = off + c * R + 10;
  std::string o = "<svg width=\"" + std::to_string(size) + "\" height=\"" +
                  std::to_string(size) + "\">";
  for (int r = 0; r < R; ++r) {
    o += "<text x=\"" + std::to_string(off + r * c + 2) +
         "\" y=\"30\" font-size=\"10\">" + std::to_string(r) + "</text>";
    o += "<text x=\"4\" y=\"" + std::to_string(off + r * c + c / 2 + 4) +
         "\" font-size=\"10\">" + std::to_string(r) + "</text>";
  }
  for (const LinkStats &l : s.diag.links) {
    double q = l.gbps / maxbw; // 1 = fastest: light; slow: dark red
    int red = 255, gb = int(60 + 195 * q);
    o += "<rect x=\"" + std::to_string(off + l.dst * c) + "\" y=\"" +
         std::to_string(off + l.src * c) + "\" width=\"" +
         std::to_string(c - 1) + "\" height=\"" + std::to_string(c - 1) +
         "\" fill=\"rgb(" + std::to_string(red) + "," + std::to_string(gb) +
         "," + std::to_string(gb) + ")\" stroke=\"#888\"><title>" +
         std::to_string(l.src) + "&#8594;" + std::to_string(l.dst) +
         f(": %.1f Gb/s (%.2fx peers)", l.gbps, l.ratio) + "</title></rect>";
  }
  return o + "</svg><p>Rows: sender, columns: receiver. Darker = slower "
             "(hover for Gb/s).</p>";
}

// One step of every rank; evidence events outlined.
std::string timelineSvg(const ScanResult &s) {
  const Trace &t = s.trace;
  if (t.world > 64)
    return "<p>World too large for the timeline; open merged.json in "
           "Perfetto.</p>";
  std::set<std::string> evidence;
  int step = -1;
  for (const Finding &fd : s.diag.findings)
    for (const std::string &e : fd.evidence)
      evidence.insert(e);
  // The step of the first evidence event, else the last step.
  for (int r = 0; r < t.world && step < 0; ++r)
    for (const Event &e : t.ranks[r].events)
      if (evidence.count(t.eventRef(r, e))) {
        step = e.step;
        break;
      }
  if (step < 0)
    step = s.diag.steps - 1;
  double lo = 1e300, hi = -1e300;
  for (const RankStats &rs : s.diag.ranks)
    for (const Event &e : t.ranks[rs.rank].events)
      if (e.step == step) {
        lo = std::min(lo, e.gb);
        hi = std::max(hi, e.ge);
      }
  if (hi <= lo)
    return "<p>No events.</p>";
  int W = 900, lane = 14, left = 60;
  std::string o = "<p>Step " + std::to_string(step) +
                  f(", %.3f ms shown.", (hi - lo) * 1e-6) +
                  " Blue compute, orange comm, green data/optimizer; red "
                  "outline = evidence.</p><svg width=\"" +
                  std::to_string(W + left + 10) + "\" height=\"" +
                  std::to_string(t.world * lane + 10) + "\">";
  std::string marks;
  for (int r = 0; r < t.world; ++r) {
    int y = 4 + r * lane;
    o += "<text x=\"2\" y=\"" + std::to_string(y + 10) +
         "\" font-size=\"10\">r" + std::to_string(r) + "</text>";
    for (const Event &e : t.ranks[r].events) {
      if (e.step != step)
        continue;
      double x = left + (e.gb - lo) / (hi - lo) * W;
      double w = std::max(0.5, (e.ge - e.gb) / (hi - lo) * W);
      const char *col = e.cat == Cat::Compute ? "#4e79a7"
                        : e.cat == Cat::Comm  ? "#f28e2b"
                                              : "#59a14f";
      std::string ref = t.eventRef(r, e);
      std::string rect = "<rect x=\"" + f("%.2f", x) + "\" y=\"" +
                         std::to_string(y) + "\" width=\"" + f("%.2f", w) +
                         "\" height=\"" + std::to_string(lane - 3) + "\"";
      std::string title = "<title>" + h(e.name) + " [" + ref + "] " +
                          f("%.1f us", (e.ge - e.gb) * 1e-3) + "</title>";
      if (evidence.count(ref))
        marks += rect + " fill=\"none\" stroke=\"#d00\" stroke-width=\"2\">" +
                 title + "</rect>";
      else
        o += rect + " fill=\"" + col + "\">" + title + "</rect>";
    }
  }
  return o + marks + "</svg>";
}
const char *kClassColors[] = {"#4e79a7", "#f28e2b", "#e15759",
                              "#76b7b2", "#59a14f", "#edc948",
                              "#b07aa1", "#ff9da7", "#9c755f"};

// Per rank: exposed communication per class (stacked, ms per step), and the
// hidden rest of its communication as a grey tail.
std::string exposureSvg(const ScanResult &s) {
  namespace mon = mapp::monitor;
  const ExposureAnalysis &a = s.exposure;
  if (a.ranks.size() > 256)
    return "<p>World too large for a bar per rank; see report.json's "
           "exposed_comm.</p>";
  double steps = std::max<size_t>(1, a.stepIds.size()), maxv = 1e-9;
  for (const RankExposure &r : a.ranks)
    maxv = std::max(maxv, r.commNs / steps * 1e-6);
  int barH = 14, W = 640, left = 120;
  int H = a.ranks.size() * (barH + 4) + 60;
  std::string o = "<svg width=\"" + std::to_string(W + left + 20) +
                  "\" height=\"" + std::to_string(H) + "\">";
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    const RankExposure &r = a.ranks[i];
    int y = 10 + i * (barH + 4);
    double x = left;
    o += "<text x=\"4\" y=\"" + std::to_string(y + 11) + "\">" +
         std::to_string(r.rank) + " " + h(s.trace.rankLabel(r.rank)) +
         "</text>";
    for (int c = 0; c < mon::kCommClasses; ++c) {
      double ms = r.cls[c].exposedNs / steps * 1e-6, w = ms / maxv * W;
      if (w <= 0)
        continue;
      o += "<rect x=\"" + f("%.1f", x) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + f("%.1f", w) + "\" height=\"" +
           std::to_string(barH) + "\" fill=\"" + kClassColors[c] +
           "\"><title>" + mon::commClassName(c) + f(" exposed %.3f ms", ms) +
           "</title></rect>";
      x += w;
    }
    double hidden = (r.commNs - r.exposedNs) / steps * 1e-6;
    if (hidden > 0)
      o += "<rect x=\"" + f("%.1f", x) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + f("%.1f", hidden / maxv * W) + "\" height=\"" +
           std::to_string(barH) + "\" fill=\"#ddd\"><title>" +
           f("hidden %.3f ms", hidden) + "</title></rect>";
  }
  int lx = left, ly = H - 40;
  for (int c = 0; c <= mon::kCommClasses; ++c) {
    const char *name = c < mon::kCommClasses ? mon::commClassName(c) : "hidden";
    const char *col = c < mon::kCommClasses ? kClassColors[c] : "#ddd";
    o += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly) +
         "\" width=\"12\" height=\"12\" fill=\"" + col + "\"/><text x=\"" +
         std::to_string(lx + 16) + "\" y=\"" + std::to_string(ly + 10) +
         "\">" + name + "</text>";
    lx += 110;
    if (lx > left + W - 100) {
      lx = left;
      ly += 18;
    }
  }
  return o + "</svg>";
}

std::string exposureTables(const ScanResult &s) {
  namespace mon = mapp::monitor;
  const ExposureAnalysis &a = s.exposure;
  double steps = std::max<size_t>(1, a.stepIds.size());
  double world = std::max(1, s.trace.world);
  std::string o = "<table><tr><th>class</th><th>exposed (ms/step, mean "
                  "rank)</th><th>communication</th><th>hidden</th><th>most "
                  "exposed rank</th></tr>";
  for (int c = 0; c < mon::kCommClasses; ++c) {
    double exposed = 0, comm = 0, most = -1;
    int mostRank = -1;
    for (const RankExposure &r : a.ranks) {
      exposed += r.cls[c].exposedNs;
      comm += r.cls[c].commNs;
      if (r.cls[c].events && r.cls[c].exposedNs > most) {
        most = r.cls[c].exposedNs;
        mostRank = r.rank;
      }
    }
    if (mostRank < 0)
      continue;
    o += std::string("<tr><td>") + mon::commClassName(c) + "</td><td>" +
         f("%.3f", exposed / world / steps * 1e-6) + "</td><td>" +
         f("%.3f", comm / world / steps * 1e-6) + "</td><td>" +
         f("%.0f%%", comm > 0 ? 100 * (1 - exposed / comm) : 0.0) +
         "</td><td>" + std::to_string(mostRank) +
         f(" (%.3f ms)", most / steps * 1e-6) + "</td></tr>";
  }
  o += "</table><h3>Critical path per step (ms)</h3><table><tr><th>step"
       "</th><th>step time</th><th>compute</th><th>communication</th><th>"
       "other</th><th>ended on rank</th></tr>";
  for (const CriticalPathStep &p : a.path) {
    std::string comm = f("%.3f", p.totalCommNs() * 1e-6);
    std::string parts;
    for (int c = 0; c < mon::kCommClasses; ++c)
      if (p.commNs[c] > 0)
        parts += std::string(parts.empty() ? "" : ", ") +
                 mon::commClassName(c) + f(" %.3f", p.commNs[c] * 1e-6);
    o += "<tr><td>" + std::to_string(p.step) + "</td><td>" +
         f("%.3f", p.stepNs * 1e-6) + "</td><td>" +
         f("%.3f", p.computeNs * 1e-6) + "</td><td>" + comm +
         (parts.empty() ? "" : " (" + parts + ")") + "</td><td>" +
         f("%.3f", p.otherNs * 1e-6) + "</td><td>" +
         std::to_string(p.endRank) + "</td></tr>";
  }
  return o + "</table>";
}

// Per class: the slowest rank, and each rank's min/mean/p95/max per event.
std::string classStatsHtml(const ScanResult &s) {
  if (s.classes.empty())
    return "<p>No events.</p>";
  std::string o = "<table><tr><th>class</th><th>slowest rank</th><th>ms/step"
                  " (x median rank)</th><th>waited for</th><th>per rank: "
                  "min / mean / p95 / max per event (ms)</th></tr>";
  for (const ClassStats &c : s.classes) {
    double slowest = 0;
    std::string per;
    const bool all = c.ranks.size() <= 64; // else the slowest rank only
    for (const RankClassStats &r : c.ranks) {
      if (r.rank == c.slowestRank)
        slowest = r.perStepNs;
      if (!all && r.rank != c.slowestRank)
        continue;
      per += (r.rank == c.slowestRank ? "<b>" : std::string()) +
             std::to_string(r.rank) +
             f(": %.3f / %.3f / %.3f / %.3f", r.minNs * 1e-6, r.meanNs * 1e-6,
               r.p95Ns * 1e-6, r.maxNs * 1e-6) +
             (r.rank == c.slowestRank ? "</b>" : "") + "<br>";
    }
    o += "<tr><td>" + h(c.name) + "</td><td>" +
         std::to_string(c.slowestRank) + " " +
         h(s.trace.rankLabel(c.slowestRank)) + "</td><td>" +
         f("%.3f (%.2fx)", slowest * 1e-6, c.slowestRatio) + "</td><td>" +
         (c.lateRank >= 0 ? std::to_string(c.lateRank) +
                                f(" (%.3f ms/step)", c.lateNsPerStep * 1e-6)
                          : std::string("")) +
         "</td><td>" + per + "</td></tr>";
  }
  return o + "</table>";
}
} // namespace

bool mapp::scan::writeHtmlReport(const ScanResult &s, const std::string &path,
                                 std::string *error) {
  const Trace &t = s.trace;
  std::string o =
      "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>mapp-scan "
      "report</title><style>body{font-family:sans-serif;margin:20px;max-width:"
      "1100px}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
      "padding:3px 8px;font-size:13px}th{background:#eee}svg text{font-family:"
      "monospace;font-size:11px}.bar{display:inline-block;height:10px;"
      "background:#e15759}pre{background:#f6f6f6;padding:8px}</style></head>"
      "<body><h1>mapp-scan report</h1><pre>" +
      h(textSummary(s)) + "</pre><h2>Findings</h2>";
  if (s.diag.findings.empty())
    o += "<p>No slow rank or slow link found.</p>";
  else {
    o += "<table><tr><th>kind</th><th>where</th><th>confidence</th><th>"
         "magnitude</th><th>evidence events</th></tr>";
    for (const Finding &fd : s.diag.findings) {
      std::string where = fd.aboutRank()
                              ? "rank " + std::to_string(fd.rank) + " (" +
                                    t.rankLabel(fd.rank) + ")"
                              : "link " + std::to_string(fd.src) + " &#8594; " +
                                    std::to_string(fd.dst);
      std::string ev;
      for (const std::string &e : fd.evidence)
        ev += h(e) + " ";
      o += "<tr><td>" + fd.kind + "</td><td>" + where + "</td><td>" +
           f("%.2f", fd.confidence) + " <span class=\"bar\" style=\"width:" +
           f("%.0f", fd.confidence * 80) + "px\"></span></td><td>" +
           h(fd.magnitude) + "</td><td>" + ev + "</td></tr>";
    }
    o += "</table>";
  }
  o += "<h2>Per-rank time per step (ms)</h2>" + breakdownSvg(s);
  o += "<h2>Exposed communication (ms per step)</h2><p>Time in a "
       "communication event with none of the rank's compute beside it; "
       "grey: the rest, hidden behind compute.</p>" +
       exposureSvg(s) + exposureTables(s);
  o += "<h2>Per-rank statistics per event class</h2>" + classStatsHtml(s);
  o += "<h2>Link bandwidth</h2>" + heatmapSvg(s);
  o += "<h2>Evidence on the timeline</h2>" + timelineSvg(s);
  if (!s.decisions.empty()) {
    o += "<h2>Elastic decisions</h2><table><tr><th>attempt</th><th>"
         "decision</th><th>evidence</th></tr>";
    for (const nlohmann::json &d : s.decisions)
      o += "<tr><td>" + std::to_string(d.value("attempt", 0)) + "</td><td>" +
           h(d.value("decision", "?")) + "</td><td>" + h(decisionText(d)) +
           "</td></tr>";
    o += "</table>";
  }
  if (s.haveWhatIf) {
    const WhatIfResult &w = s.whatIf;
    o += "<h2>What if</h2><table><tr><th>measured step</th><th>replayed "
         "</th><th>repaired</th><th>saved</th></tr><tr><td>" +
         f("%.3f ms", w.measuredStepMs) + "</td><td>" +
         f("%.3f ms", w.replayStepMs) + "</td><td>" +
         f("%.3f ms", w.repairedStepMs) + "</td><td>" +
         f("%.3f ms (%.1f%%)", w.savedMs, w.savedPct) + "</td></tr></table>";
  }
  o += "<h2>Clock alignment</h2><table><tr><th>rank</th><th>offset (us)</th>"
       "<th>drift (ppm)</th><th>anchors</th><th>residual rms (ns)</th><th>"
       "residual max (ns)</th></tr>";
  for (int r = 0; r < t.world; ++r) {
    const RankClock &c = s.align.clocks[r];
    o += "<tr><td>" + std::to_string(r) + "</td><td>" +
         f("%.3f", c.offsetNs * 1e-3) + "</td><td>" + f("%.3f", c.driftPpm) +
         "</td><td>" + std::to_string(c.anchors) + "</td><td>" +
         f("%.0f", c.collRmsNs) + "</td><td>" + f("%.0f", c.collMaxNs) +
         "</td></tr>";
  }
  o += "</table></body></html>\n";
  std::ofstream out(path);
  out << o;
  if (!out) {
    *error = path + ": cannot write";
    return false;
  }
  return true;
}

//===- mapp-scan.cpp - Merge, align and diagnose per-rank traces ----------===//
//
// mapp-scan DIR [-o merged.json] [--report report.json] [--html report.html]
//           [--steps A:B] [--ranks LIST] [--max-mb N] [--what-if]
// See docs/mapp-scan.md.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/Follow.h"
#include "mapp/scan/Report.h"

#include <cmath>
#include <memory>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

using namespace mapp::scan;

static const char *kUsage =
    "usage: mapp-scan DIR [-o merged.json] [--report report.json]\n"
    "                 [--html report.html] [--steps A:B] [--ranks LIST]\n"
    "                 [--max-mb N] [--what-if] [--no-align]\n"
    "                 [--rank-threshold T] [--link-threshold T]\n"
    "                 [--compute-clock auto|span] [--allow-truncated]\n"
    "                 [--allow-inconsistent] [--max-residual-fraction F]\n"
    "                 [--max-violation-fraction F] [-q]\n"
    "       mapp-scan --follow DIR [--alerts FILE] [--follow-timeout S]\n"
    "       mapp-scan --replay-summaries FILE [--alerts FILE]\n"
    "  DIR holds rank-{r}.trace.jsonl files (docs/trace-format.md).\n"
    "  --steps A:B      merged trace keeps steps A..B-1 (A: or :B open)\n"
    "  --ranks LIST     merged trace keeps these ranks, e.g. 0,2,4-7\n"
    "  --max-mb N       merged trace stops adding steps past N MiB\n"
    "  --what-if        replay with the findings repaired, predict the saving\n"
    "  --no-align       trust the headers' wall clocks (for comparison)\n"
    "  --compute-clock  auto: compare compute by thread CPU time where the\n"
    "                   trace has it (default); span: by wall span\n"
    "  Inconsistent data (a trace cut short, lost events, clocks that do not\n"
    "  align; docs/mapp-scan.md) withholds the findings and exits 3;\n"
    "  --allow-inconsistent reports them anyway and exits 0.\n"
    "  --follow         diagnose DIR's files as they grow, with mapp-run\n"
    "                   --monitor's diagnosis: alerts as JSON lines to\n"
    "                   --alerts FILE (default stdout), one line each to\n"
    "                   stderr; stops when every rank file has its footer\n"
    "                   or nothing grew for --follow-timeout S (default 60)\n"
    "  --replay-summaries  the monitor rank's diagnosis on recorded step\n"
    "                   summaries (mapp-sim --summaries), timed per step\n";

static int fail(const std::string &msg) {
  std::fprintf(stderr, "mapp-scan: error: %s\n", msg.c_str());
  return 1;
}

static bool parseRanks(const std::string &s, std::set<int> &out) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t dash = item.find('-');
      size_t used;
      if (dash == std::string::npos) {
        out.insert(std::stoi(item, &used));
        if (used != item.size())
          return false;
      } else {
        int a = std::stoi(item.substr(0, dash)),
            b = std::stoi(item.substr(dash + 1));
        if (a > b || a < 0)
          return false;
        for (int r = a; r <= b; ++r)
          out.insert(r);
      }
    } catch (const std::exception &) {
      return false;
    }
  }
  return !out.empty();
}

/// A finite number (strtod also takes "nan" and "inf", which no option wants).
static bool parseNumber(const char *s, double &v) {
  char *end;
  v = std::strtod(s, &end);
  return end != s && !*end && std::isfinite(v);
}

int main(int argc, char **argv) {
  std::string dir, merged, report, html;
  ChromeOptions co;
  ReadOptions ro;
  AlignOptions ao;
  DiagnoseOptions dopt;
  ConsistencyOptions copt;
  bool doWhatIf = false, quiet = false, allowInconsistent = false;
  bool followMode = false;
  std::string replay;
  FollowOptions fo;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mapp-scan: error: %s needs a value\n%s",
                     a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-o")
      merged = next();
    else if (a == "--report")
      report = next();
    else if (a == "--html")
      html = next();
    else if (a == "--steps") {
      std::string v = next();
      size_t c = v.find(':');
      try {
        if (c == std::string::npos)
          throw std::invalid_argument(v);
        if (c > 0)
          co.stepBegin = std::stoi(v.substr(0, c));
        if (c + 1 < v.size())
          co.stepEnd = std::stoi(v.substr(c + 1));
      } catch (const std::exception &) {
        return fail("--steps expects A:B, got '" + v + "'");
      }
    } else if (a == "--ranks") {
      std::string v = next();
      if (!parseRanks(v, co.ranks))
        return fail("--ranks expects a list like 0,2,4-7, got '" + v + "'");
    } else if (a == "--max-mb") {
      if (!parseNumber(next(), co.maxMb) || co.maxMb <= 0)
        return fail("--max-mb expects a positive number");
    } else if (a == "--rank-threshold") {
      if (!parseNumber(next(), dopt.rankThreshold) || dopt.rankThreshold <= 0)
        return fail("--rank-threshold expects a positive number");
    } else if (a == "--link-threshold") {
      if (!parseNumber(next(), dopt.linkThreshold) || dopt.linkThreshold <= 0 ||
          dopt.linkThreshold >= 1)
        return fail("--link-threshold expects a number in (0, 1)");
    } else if (a == "--compute-clock") {
      std::string v = next();
      if (v != "auto" && v != "span")
        return fail("--compute-clock expects auto or span, got '" + v + "'");
      dopt.cpuClock = v == "auto";
    } else if (a == "--max-residual-fraction") {
      if (!parseNumber(next(), copt.maxResidualFraction) ||
          !(copt.maxResidualFraction > 0))
        return fail("--max-residual-fraction expects a positive number");
    } else if (a == "--max-violation-fraction") {
      if (!parseNumber(next(), copt.maxViolationFraction) ||
          !(copt.maxViolationFraction >= 0) || copt.maxViolationFraction > 1)
        return fail("--max-violation-fraction expects a number in [0, 1]");
    } else if (a == "--allow-inconsistent")
      allowInconsistent = true;
    else if (a == "--follow")
      followMode = true;
    else if (a == "--replay-summaries")
      replay = next();
    else if (a == "--alerts")
      fo.alerts = next();
    else if (a == "--follow-timeout") {
      if (!parseNumber(next(), fo.idleTimeoutS) || fo.idleTimeoutS <= 0)
        return fail("--follow-timeout expects a positive number of seconds");
    } else if (a == "--what-if")
      doWhatIf = true;
    else if (a == "--no-align")
      ao.enabled = false;
    else if (a == "--allow-truncated")
      ro.allowTruncated = true;
    else if (a == "-q")
      quiet = true;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-')
      return fail("unknown option '" + a + "'\n" + kUsage);
    else if (dir.empty())
      dir = a;
    else
      return fail("more than one trace directory given");
  }
  if (!replay.empty()) {
    if (!dir.empty() || followMode)
      return fail("--replay-summaries takes no trace directory");
    std::vector<mapp::monitor::StepSummary> recs;
    ReplayStats st;
    std::string rerr;
    if (!mapp::monitor::readSummaries(replay, recs, &rerr) ||
        !replaySummaries(recs, fo.diagnosis, st, &rerr))
      return fail(rerr);
    std::unique_ptr<mapp::monitor::AlertLog> log =
        mapp::monitor::AlertLog::open(fo.alerts, "mapp-scan", &rerr);
    if (!log)
      return fail("--alerts: " + rerr);
    for (const mapp::monitor::Alert &a : st.alerts)
      log->write(a);
    std::fprintf(stderr,
                 "mapp-scan --replay-summaries: %d ranks, %d steps: per-step "
                 "diagnosis max %.1f ms, median %.1f ms; all steps %.2f s; "
                 "window memory %.1f MiB; %zu alert line(s)\n",
                 st.world, st.steps, st.maxStepMs, st.medianStepMs, st.totalS,
                 st.memoryBytes / 1048576.0, st.alerts.size());
    if (!st.exposure.empty())
      std::fprintf(stderr, "mapp-scan --replay-summaries: %s\n",
                   st.exposure.c_str());
    return 0;
  }
  if (dir.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }

  if (followMode) {
    fo.dir = dir;
    FollowResult fr;
    std::string ferr;
    if (!follow(fo, fr, &ferr))
      return fail(ferr);
    if (!quiet) {
      std::fprintf(stderr,
                   "mapp-scan --follow: %d ranks, %lld steps diagnosed, %zu "
                   "alert line(s), window memory %.1f MiB%s\n",
                   fr.world, static_cast<long long>(fr.steps), fr.alerts,
                   fr.peakMemoryBytes / 1048576.0,
                   fr.complete ? "" : "; stopped: nothing grew for the "
                                      "--follow-timeout");
      if (!fr.exposure.empty())
        std::fprintf(stderr, "mapp-scan --follow: %s\n", fr.exposure.c_str());
    }
    return 0;
  }
  if (!fo.alerts.empty() && fo.alerts != "-")
    return fail("--alerts needs --follow");

  ScanResult s;
  std::string err;
  if (!readTraceDir(dir, ro, s.trace, &err))
    return fail(err);
  for (int r : co.ranks)
    if (r >= s.trace.world)
      return fail("--ranks names rank " + std::to_string(r) +
                  " but the world size is " + std::to_string(s.trace.world));
  s.matches = matchEvents(s.trace);
  s.align = alignClocks(s.trace, s.matches, ao);
  s.diag = diagnose(s.trace, s.matches, dopt);
  s.exposure = analyzeExposure(s.trace, s.matches);
  s.classes = eventClassStats(s.trace, s.matches);
  copt.checkAlignment = ao.enabled;
  s.consistency = checkConsistency(s.trace, s.matches, s.align, s.diag, copt);
  if (!allowInconsistent)
    withholdFindings(s);
  if (doWhatIf) {
    if (!whatIf(s.trace, s.matches, s.diag, s.whatIf, &err))
      return fail("what-if replay: " + err);
    s.haveWhatIf = true;
  }
  if (!merged.empty()) {
    std::string note;
    if (!writeChromeTrace(s, co, merged, &note, &err))
      return fail(err);
    if (!note.empty())
      std::fprintf(stderr, "mapp-scan: note: %s\n", note.c_str());
  }
  if (!report.empty()) {
    std::ofstream out(report);
    out << reportJson(s).dump(1) << "\n";
    if (!out)
      return fail(report + ": cannot write");
  }
  if (!html.empty() && !writeHtmlReport(s, html, &err))
    return fail(err);
  if (!quiet)
    std::fputs(textSummary(s).c_str(), stdout);
  if (s.consistency.consistent())
    return 0;
  for (const std::string &p : s.consistency.problems)
    std::fprintf(stderr, "mapp-scan: warning: inconsistent data: %s\n",
                 p.c_str());
  return allowInconsistent ? 0 : 3;
}

//===- mapp-scan.cpp - Merge, align and diagnose per-rank traces ----------===//
//
// mapp-scan DIR [-o merged.json] [--report report.json] [--html report.html]
//           [--steps A:B] [--ranks LIST] [--max-mb N] [--what-if]
// See docs/mapp-scan.md.
//
//===----------------------------------------------------------------------===//

#include "mapp/scan/ScanDriver.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace mapp::scan;

static const char *kUsage =
    "usage: mapp-scan DIR [-o merged.json] [--report report.json]\n"
    "                 [--html report.html] [--steps A:B] [--ranks LIST]\n"
    "                 [--max-mb N] [--what-if] [--no-align]\n"
    "                 [--rank-threshold T] [--link-threshold T]\n"
    "                 [--compute-clock auto|span] [--allow-truncated]\n"
    "                 [--allow-inconsistent] [--max-residual-fraction F]\n"
    "                 [--max-violation-fraction F] [--decisions FILE] [-q]\n"
    "       mapp-scan --follow DIR [--alerts FILE] [--follow-timeout S]\n"
    "       mapp-scan --replay-summaries FILE [--alerts FILE]\n"
    "  DIR holds rank-{r}.trace.jsonl files (docs/trace-format.md).\n"
    "  --steps A:B      merged trace keeps steps A..B-1 (A: or :B open)\n"
    "  --ranks LIST     merged trace keeps these ranks, e.g. 0,2,4-7\n"
    "  --max-mb N       merged trace stops adding steps past N MiB\n"
    "  --what-if        replay with the findings repaired, predict the saving\n"
    "  --decisions FILE mapp-run --elastic's decisions (its --monitor file)\n"
    "                   in the report, the HTML report and the summary\n"
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

/// A finite number (strtod also takes "nan" and "inf", which no option wants).
static bool parseNumber(const char *s, double &v) {
  char *end;
  v = std::strtod(s, &end);
  return end != s && !*end && std::isfinite(v);
}

int main(int argc, char **argv) {
  ScanRequest r;
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
      r.merged = next();
    else if (a == "--report")
      r.report = next();
    else if (a == "--html")
      r.html = next();
    else if (a == "--steps") {
      std::string v = next();
      size_t c = v.find(':');
      try {
        if (c == std::string::npos)
          throw std::invalid_argument(v);
        if (c > 0)
          r.co.stepBegin = std::stoi(v.substr(0, c));
        if (c + 1 < v.size())
          r.co.stepEnd = std::stoi(v.substr(c + 1));
      } catch (const std::exception &) {
        return fail("--steps expects A:B, got '" + v + "'");
      }
    } else if (a == "--ranks") {
      std::string v = next();
      if (!parseIndexList(v, r.co.ranks))
        return fail("--ranks expects a list like 0,2,4-7, got '" + v + "'");
    } else if (a == "--max-mb") {
      if (!parseNumber(next(), r.co.maxMb) || r.co.maxMb <= 0)
        return fail("--max-mb expects a positive number");
    } else if (a == "--rank-threshold") {
      if (!parseNumber(next(), r.dopt.rankThreshold) ||
          r.dopt.rankThreshold <= 0)
        return fail("--rank-threshold expects a positive number");
    } else if (a == "--link-threshold") {
      if (!parseNumber(next(), r.dopt.linkThreshold) ||
          r.dopt.linkThreshold <= 0 || r.dopt.linkThreshold >= 1)
        return fail("--link-threshold expects a number in (0, 1)");
    } else if (a == "--compute-clock") {
      std::string v = next();
      if (v != "auto" && v != "span")
        return fail("--compute-clock expects auto or span, got '" + v + "'");
      r.dopt.cpuClock = v == "auto";
    } else if (a == "--max-residual-fraction") {
      if (!parseNumber(next(), r.copt.maxResidualFraction) ||
          !(r.copt.maxResidualFraction > 0))
        return fail("--max-residual-fraction expects a positive number");
    } else if (a == "--max-violation-fraction") {
      if (!parseNumber(next(), r.copt.maxViolationFraction) ||
          !(r.copt.maxViolationFraction >= 0) ||
          r.copt.maxViolationFraction > 1)
        return fail("--max-violation-fraction expects a number in [0, 1]");
    } else if (a == "--allow-inconsistent")
      r.allowInconsistent = true;
    else if (a == "--follow")
      r.followMode = true;
    else if (a == "--replay-summaries")
      r.replay = next();
    else if (a == "--decisions")
      r.decisions = next();
    else if (a == "--alerts")
      r.fo.alerts = next();
    else if (a == "--follow-timeout") {
      if (!parseNumber(next(), r.fo.idleTimeoutS) || r.fo.idleTimeoutS <= 0)
        return fail("--follow-timeout expects a positive number of seconds");
    } else if (a == "--what-if")
      r.doWhatIf = true;
    else if (a == "--no-align")
      r.ao.enabled = false;
    else if (a == "--allow-truncated")
      r.ro.allowTruncated = true;
    else if (a == "-q")
      r.quiet = true;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-')
      return fail("unknown option '" + a + "'\n" + kUsage);
    else if (r.dir.empty())
      r.dir = a;
    else
      return fail("more than one trace directory given");
  }
  if (r.replay.empty() && r.dir.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string err;
  int status = runScanRequest(r, &err);
  return status == 1 ? fail(err) : status;
}

//===- Report.h - mapp-scan outputs -----------------------------*- C++ -*-===//
//
// report.json, the text summary, the Chrome trace (Perfetto) and the
// self-contained HTML report.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_REPORT_H
#define MAPP_SCAN_REPORT_H

#include "mapp/scan/Align.h"
#include "mapp/scan/CommStats.h"
#include "mapp/scan/Consistency.h"
#include "mapp/scan/Diagnose.h"
#include "mapp/scan/Replay.h"

#include <nlohmann/json.hpp>

#include <set>

namespace mapp::scan {

struct ScanResult {
  Trace trace;
  Matches matches;
  AlignResult align;
  Diagnosis diag;
  Consistency consistency;
  /// Findings set aside because the data is inconsistent (withholdFindings).
  std::vector<Finding> withheld;
  bool haveWhatIf = false;
  WhatIfResult whatIf;
  /// Exposed communication, the steps' critical paths and per-class
  /// statistics (CommStats.h).
  ExposureAnalysis exposure;
  std::vector<ClassStats> classes;
  /// mapp-run --elastic's decisions (--decisions FILE; Decisions.h).
  std::vector<nlohmann::json> decisions;
};

/// Moves the findings to `withheld` when the data is inconsistent: no
/// confident finding on data that cannot support one.
void withholdFindings(ScanResult &s);

nlohmann::json reportJson(const ScanResult &s);
std::string textSummary(const ScanResult &s);

struct ChromeOptions {
  int stepBegin = -1, stepEnd = -1; // [begin, end); -1 = open
  std::set<int> ranks;              // empty = all
  double maxMb = 0;                 // 0 = unbounded; whole steps are dropped
};
/// Writes the Chrome Trace JSON; *note says what a bound left out.
bool writeChromeTrace(const ScanResult &s, const ChromeOptions &o,
                      const std::string &path, std::string *note,
                      std::string *error);

bool writeHtmlReport(const ScanResult &s, const std::string &path,
                     std::string *error);

} // namespace mapp::scan

#endif // MAPP_SCAN_REPORT_H

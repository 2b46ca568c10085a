//===- ScanDriver.h - mapp-scan's modes over the scan library -*- C++ -*-===//
//
// What mapp-scan's command line asks for, and the one function that does it.
// See docs/mapp-scan.md.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_SCANDRIVER_H
#define MAPP_SCAN_SCANDRIVER_H

#include "mapp/scan/Follow.h"
#include "mapp/scan/Report.h"

#include <string>

namespace mapp::scan {

struct ScanRequest {
  std::string dir;                  // the trace directory
  std::string merged, report, html; // -o, --report, --html ("" = none)
  ChromeOptions co;                 // --steps, --ranks, --max-mb
  ReadOptions ro;
  AlignOptions ao;
  DiagnoseOptions dopt;
  ConsistencyOptions copt;
  bool doWhatIf = false, quiet = false, allowInconsistent = false;
  bool followMode = false;
  std::string replay;    // --replay-summaries FILE
  std::string decisions; // --decisions FILE (a mapp-run --monitor file)
  FollowOptions fo;
};

/// --replay-summaries when `r.replay` is set, else --follow or the offline
/// pipeline over `r.dir`. Returns the exit status: 0, 3 (inconsistent data
/// withheld the findings), or 1 with *err the message (without the tool's
/// name). Results, notes and warnings are printed as it goes.
int runScanRequest(ScanRequest r, std::string *err);

} // namespace mapp::scan

#endif

//===- Decisions.h - elastic decisions beside a trace's report --*- C++ -*-===//
//
// mapp-run --elastic writes every decision it takes (shrink, grow,
// repartition and the gain measured after it, a checkpoint set aside, give
// up) as a JSON line with "event": "elastic" into its --monitor file, among
// the monitor's alerts. `mapp-scan DIR --decisions FILE` puts them in the
// report beside the trace's findings (docs/elastic.md).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCAN_DECISIONS_H
#define MAPP_SCAN_DECISIONS_H

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mapp::scan {

/// The "elastic" lines of a monitor file, in order; other JSON lines (the
/// alerts) are skipped. False with *err naming the file and line when it
/// cannot be read or a line is not a JSON object.
bool readDecisions(const std::string &path, std::vector<nlohmann::json> &out,
                   std::string *err);

/// One line of text for a decision: what was decided, where, and its gain.
std::string decisionText(const nlohmann::json &d);

} // namespace mapp::scan

#endif

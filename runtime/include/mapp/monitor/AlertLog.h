//===- AlertLog.h - Alerts as JSON lines and one stderr line ----*- C++ -*-===//
//
// One JSON object per line (docs/mapp-scan.md, "Live monitor"):
//   {"step":11,"kind":"slow-rank","rank":5,"confidence":0.97,"ratio":3.0,
//    "since":10,"cause":"compute","evidence":{...},"victims":[...],
//    "at_step":12,"text":"..."}
// slow-link lines carry "src"/"dst" instead of "rank"; `recovered` lines
// "of" (the kind that ended). Each line is flushed when written, so a
// reader tailing the file sees it at once.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_MONITOR_ALERTLOG_H
#define MAPP_MONITOR_ALERTLOG_H

#include "mapp/monitor/Diagnoser.h"

#include <cstdio>
#include <memory>
#include <string>

namespace mapp::monitor {

/// The alert as one JSON object (no newline). `atStep`: the step the
/// writer was at when it emitted the alert (-1: leave out).
std::string alertJson(const Alert &a, int64_t atStep = -1);

class AlertLog {
public:
  /// Creates (truncates; `append`: appends to) `path`; null with *error
  /// naming the path and the reason when it cannot be written. "-" writes
  /// to stdout.
  static std::unique_ptr<AlertLog> open(const std::string &path,
                                        const std::string &tool,
                                        std::string *error,
                                        bool append = false);
  ~AlertLog();
  /// The JSON line to the file, "TOOL: step S: KIND TEXT" to stderr.
  void write(const Alert &a, int64_t atStep = -1);
  size_t written() const { return written_; }

private:
  AlertLog(std::FILE *f, bool own, std::string tool)
      : file_(f), own_(own), tool_(std::move(tool)) {}
  std::FILE *file_;
  bool own_;
  std::string tool_;
  size_t written_ = 0;
};

} // namespace mapp::monitor

#endif

//===- RunFlags.h - mapp-run's command line -------------------*- C++ -*-===//
//
// Parses mapp-run's flags into RunOptions (Run.h), with every check of a
// bad combination; the tool prints the messages and exits.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_RUNFLAGS_H
#define MAPP_RT_RUNFLAGS_H

#include "mapp/rt/Calibrate.h"
#include "mapp/rt/Run.h"

#include <stdexcept>
#include <string>

namespace mapp::rt {

/// A bad command line; what() is the message without the tool's name.
struct RunUsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RunCommandLine {
  bool help = false; // --help/-h: print runUsage() and stop
  RunOptions options;
  bool calibrate = false; // --calibrate: measure a profile, run no plan
  CalibrateOptions calibration;
};

/// argv[1..argc) in order; throws RunUsageError at the first problem.
RunCommandLine parseRunCommandLine(int argc, char **argv);

/// --help's text, ending with the communicators this build has.
std::string runUsage();

/// One argument as a flag and, for `--flag=value`, its inline value
/// (`inlineValue` false for a bare `--flag`).
struct FlagArg {
  std::string flag, value;
  bool inlineValue = false;
};
FlagArg splitFlagArg(const std::string &arg);

} // namespace mapp::rt

#endif

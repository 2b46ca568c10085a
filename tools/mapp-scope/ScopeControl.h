//===- ScopeControl.h - mapp-scope's side of the control channel -*- C++ -*-===//
//
// The store says only how a run is controlled ("tcp:127.0.0.1:PORT" or
// "file:PATH"); it never chooses where mapp-scope connects or writes. A
// port is reached only with the credentials of the job's token file (0600,
// owned by this user, read fresh each time), and only when that file names
// the same port; a control file is written only when it was named on
// mapp-scope's own command line (--control-file), through a unique
// temporary file and a rename.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPECONTROL_H
#define MAPP_SCOPE_SCOPECONTROL_H

#include "mapp/rt/ProbeControl.h"

#include <string>

namespace mapp::scope {

struct ControlOptions {
  std::string tokenFile;   // the job's token file ("" = none known)
  std::string controlFile; // the one control file mapp-scope may write
};

class ControlClient {
public:
  explicit ControlClient(ControlOptions o) : opts_(std::move(o)) {}
  /// Forwards a validated command to the job behind `endpoint`; returns
  /// the job's JSON reply. Error with the reason otherwise.
  std::string set(const std::string &endpoint,
                  const mapp::rt::SwitchCommand &c) const;
  /// The job's live state, or "null" when it cannot be asked.
  std::string state(const std::string &endpoint) const;

private:
  std::string ask(const std::string &endpoint, const std::string &request,
                  bool needReply) const;
  ControlOptions opts_;
};

} // namespace mapp::scope

#endif

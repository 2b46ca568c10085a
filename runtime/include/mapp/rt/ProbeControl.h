//===- ProbeControl.h - live perturbation switches --------------*- C++ -*-===//
//
// A running job takes switch changes from a control file (re-read when it
// changes) or a loopback TCP port (one JSON request line per connection).
// Changes are queued and applied between steps, so a step never sees half
// of an update. Requests are typed JSON; nothing received is ever executed.
//
//   file:  {"switches": [{"id": 0, "enabled": true, "magnitude": 0.5}, ...]}
//   tcp:   {"token": T, "op": "set", "switch": 0, "enabled": false, "magnitude": 0.2}
//          {"token": T, "op": "state"}   -> step, switches, latest scalar samples
//
// The port requires the token the job writes to its token file (0600,
// ControlFiles.h); a request without it is refused and logged. The server
// is one poll() loop (RequestGate.h): each connection has a deadline for
// its request line and answer, at most kMaxWaiting wait for their line (a
// newcomer displaces the oldest, so reconnecting clients cannot lock the
// port), and a slow or vanished client costs nothing to the others and
// never a signal (sends use MSG_NOSIGNAL).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_PROBECONTROL_H
#define MAPP_RT_PROBECONTROL_H

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace mapp::rt {

struct SwitchCommand {
  int64_t id = 0;
  std::optional<bool> enabled;
  std::optional<double> magnitude;
  std::string source; // "file" or "tcp"
};

class ProbeControl {
public:
  static constexpr int kMaxWaiting = 64;
  static constexpr int kRequestMs = 3000; // to send the request line and
                                          // receive the answer, in total
  static constexpr size_t kMaxRequest = 4096;

  /// `endpoint` is a file path or a port number (0 = any free port). For a
  /// port, the token is written to `tokenFile`. The validator returns "" or
  /// why a command is refused (unknown switch); `state` answers
  /// {"op":"state"} with a JSON object.
  ProbeControl(const std::string &endpoint, const std::string &tokenFile,
               std::function<std::string(const SwitchCommand &)> validate,
               std::function<std::string()> state);
  ~ProbeControl();
  ProbeControl(const ProbeControl &) = delete;
  ProbeControl &operator=(const ProbeControl &) = delete;

  /// Commands received since the last call (file changes included).
  std::vector<SwitchCommand> poll();
  /// "file:PATH" or "tcp:127.0.0.1:PORT" (the bound port).
  std::string endpoint() const;
  /// The token file of a port endpoint ("" for a file endpoint).
  const std::string &tokenFile() const { return tokenFile_; }

private:
  void serve();
  std::string answer(const std::string &line, const std::string &peer);
  void log(const std::string &msg);
  void readFile();

  std::string file_, tokenFile_, token_;
  int listenFd_ = -1, port_ = 0;
  std::function<std::string(const SwitchCommand &)> validate_;
  std::function<std::string()> state_;
  std::mutex mu_;
  std::vector<SwitchCommand> pending_;
  int64_t fileStamp_ = -1;
  bool fileWarned_ = false;
  int logged_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Parses one control request line; Error on anything malformed (unknown
/// keys, wrong types, a magnitude outside the common bound).
SwitchCommand parseSwitchCommand(const std::string &json,
                                 const std::string &source);

/// A port number "0".."65535"; Error naming `flag` otherwise.
int parsePort(const std::string &flag, const std::string &text);

} // namespace mapp::rt

#endif

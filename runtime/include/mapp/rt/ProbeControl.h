//===- ProbeControl.h - live perturbation switches --------------*- C++ -*-===//
//
// A running job takes switch changes from a control file (re-read when it
// changes) or a loopback TCP port (one JSON request per connection). Changes
// are queued and applied between steps, so a step never sees half of an
// update. Requests are typed JSON; nothing received is ever executed.
//
//   file:  {"switches": [{"id": 0, "enabled": true, "magnitude": 0.5}, ...]}
//   tcp:   {"op": "set", "switch": 0, "enabled": false, "magnitude": 0.2}
//          {"op": "state"}   -> step, switches, latest scalar samples
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
  /// `endpoint` is a file path or a port number (0 = any free port). The
  /// validator returns "" or why a command is refused (unknown switch);
  /// `state` answers {"op":"state"} with a JSON object.
  ProbeControl(const std::string &endpoint,
               std::function<std::string(const SwitchCommand &)> validate,
               std::function<std::string()> state);
  ~ProbeControl();
  ProbeControl(const ProbeControl &) = delete;
  ProbeControl &operator=(const ProbeControl &) = delete;

  /// Commands received since the last call (file changes included).
  std::vector<SwitchCommand> poll();
  /// "file:PATH" or "tcp:127.0.0.1:PORT" (the bound port).
  std::string endpoint() const;

private:
  void serve();
  void handle(int fd);
  void readFile();

  std::string file_;
  int listenFd_ = -1, port_ = 0;
  std::function<std::string(const SwitchCommand &)> validate_;
  std::function<std::string()> state_;
  std::mutex mu_;
  std::vector<SwitchCommand> pending_;
  int64_t fileStamp_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Parses one control request line; Error on anything malformed.
SwitchCommand parseSwitchCommand(const std::string &json,
                                 const std::string &source);

} // namespace mapp::rt

#endif

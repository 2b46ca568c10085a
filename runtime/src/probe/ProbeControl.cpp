//===- ProbeControl.cpp - control file and loopback socket ----------------===//
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <netinet/in.h>
#include <poll.h>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::rt;
using json = nlohmann::json;

namespace {

bool allDigits(const std::string &s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

SwitchCommand fromObject(const json &j, const std::string &source) {
  if (!j.is_object())
    fail("a switch command must be a JSON object");
  SwitchCommand c;
  c.source = source;
  const char *idKey = j.contains("switch") ? "switch" : "id";
  if (!j.contains(idKey) || !j[idKey].is_number_integer() || j[idKey] < 0)
    fail("a switch command needs \"switch\": a switch id >= 0");
  c.id = j[idKey].get<int64_t>();
  if (j.contains("enabled")) {
    if (!j["enabled"].is_boolean())
      fail("\"enabled\" must be true or false");
    c.enabled = j["enabled"].get<bool>();
  }
  if (j.contains("magnitude")) {
    if (!j["magnitude"].is_number() ||
        !std::isfinite(j["magnitude"].get<double>()))
      fail("\"magnitude\" must be a finite number");
    c.magnitude = j["magnitude"].get<double>();
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "switch" && it.key() != "id" && it.key() != "enabled" &&
        it.key() != "magnitude" && it.key() != "op")
      fail("unknown key \"", it.key(), "\" in a switch command");
  return c;
}

} // namespace

SwitchCommand mapp::rt::parseSwitchCommand(const std::string &text,
                                           const std::string &source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    fail("not valid JSON");
  return fromObject(j, source);
}

ProbeControl::ProbeControl(
    const std::string &endpoint,
    std::function<std::string(const SwitchCommand &)> validate,
    std::function<std::string()> state)
    : validate_(std::move(validate)), state_(std::move(state)) {
  if (!allDigits(endpoint)) {
    file_ = endpoint;
    readFile();
    return;
  }
  int port = std::stoi(endpoint);
  if (port > 65535)
    fail("--probe-control: port ", port, " out of range");
  listenFd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  // Loopback only: the control port is never reachable from other hosts.
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (listenFd_ < 0 ||
      bind(listenFd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
      listen(listenFd_, 8) != 0) {
    int e = errno;
    if (listenFd_ >= 0)
      close(listenFd_);
    fail("--probe-control: cannot listen on 127.0.0.1:", port, ": ",
         std::strerror(e));
  }
  socklen_t len = sizeof addr;
  getsockname(listenFd_, reinterpret_cast<sockaddr *>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

ProbeControl::~ProbeControl() {
  stop_ = true;
  if (thread_.joinable())
    thread_.join();
  if (listenFd_ >= 0)
    close(listenFd_);
}

std::string ProbeControl::endpoint() const {
  return file_.empty() ? "tcp:127.0.0.1:" + std::to_string(port_)
                       : "file:" + file_;
}

void ProbeControl::readFile() {
  struct stat st;
  if (stat(file_.c_str(), &st) != 0)
    return; // not written yet: nothing to apply
  int64_t stamp = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                  st.st_mtim.tv_nsec + st.st_size;
  if (stamp == fileStamp_)
    return;
  fileStamp_ = stamp;
  std::ifstream in(file_);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  // A half-written file (no atomic rename by the writer) is retried later.
  if (j.is_discarded() || !j.is_object() || !j.contains("switches") ||
      !j["switches"].is_array()) {
    fileStamp_ = -1;
    return;
  }
  std::lock_guard<std::mutex> l(mu_);
  for (const json &e : j["switches"]) {
    try {
      SwitchCommand c = fromObject(e, "file");
      if (validate_(c).empty())
        pending_.push_back(c);
    } catch (const Error &) {
      // Malformed entries are skipped; the rest still apply.
    }
  }
}

std::vector<SwitchCommand> ProbeControl::poll() {
  if (!file_.empty())
    readFile();
  std::lock_guard<std::mutex> l(mu_);
  std::vector<SwitchCommand> out;
  out.swap(pending_);
  return out;
}

void ProbeControl::serve() {
  while (!stop_) {
    pollfd p{listenFd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    int fd = accept(listenFd_, nullptr, nullptr);
    if (fd >= 0) {
      handle(fd);
      close(fd);
    }
  }
}

void ProbeControl::handle(int fd) {
  // One request line of at most 4 KiB, read within one second.
  std::string line;
  char buf[512];
  while (line.size() < 4096 && line.find('\n') == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0)
      break;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    line.append(buf, n);
  }
  json reply;
  try {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      fail("not a JSON object");
    std::string op = j.value("op", "set");
    if (op == "state") {
      reply = json::parse(state_());
      reply["ok"] = true;
    } else if (op == "set") {
      SwitchCommand c = fromObject(j, "tcp");
      std::string why = validate_(c);
      if (!why.empty())
        fail(why);
      std::lock_guard<std::mutex> l(mu_);
      pending_.push_back(c);
      reply = {{"ok", true}};
    } else {
      fail("unknown op \"", op, "\" (expected set or state)");
    }
  } catch (const std::exception &e) {
    reply = {{"ok", false}, {"error", e.what()}};
  }
  std::string out = reply.dump() + "\n";
  (void)!write(fd, out.data(), out.size());
}

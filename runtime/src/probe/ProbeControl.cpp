//===- ProbeControl.cpp - control file and loopback socket ----------------===//
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/ProbeReduce.h"
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RequestGate.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <iostream>
#include <netinet/in.h>
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
    if (!j["magnitude"].is_number())
      fail("\"magnitude\" must be a number");
    double m = j["magnitude"].get<double>();
    std::string why = magnitudeProblem("", m);
    if (!why.empty())
      fail(why);
    c.magnitude = m;
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "switch" && it.key() != "id" && it.key() != "enabled" &&
        it.key() != "magnitude" && it.key() != "op")
      fail("unknown key \"", it.key(), "\" in a switch command");
  return c;
}

} // namespace

int mapp::rt::parsePort(const std::string &flag, const std::string &text) {
  // Digits only, and at most 5 of them before any conversion: no exception
  // and no wrap-around for 99999999999.
  if (!allDigits(text) || text.size() > 5 || std::stol(text) > 65535)
    fail(flag, ": '", text, "' is not a port (0..65535)");
  return static_cast<int>(std::stol(text));
}

SwitchCommand mapp::rt::parseSwitchCommand(const std::string &text,
                                           const std::string &source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    fail("not valid JSON");
  return fromObject(j, source);
}

ProbeControl::ProbeControl(
    const std::string &endpoint, const std::string &tokenFile,
    std::function<std::string(const SwitchCommand &)> validate,
    std::function<std::string()> state)
    : validate_(std::move(validate)), state_(std::move(state)) {
  if (!allDigits(endpoint)) {
    file_ = endpoint;
    readFile();
    return;
  }
  int port = parsePort("--probe-control", endpoint);
  if (tokenFile.empty())
    fail("--probe-control ", port,
         ": the control token needs a file: give --probe-db or "
         "--probe-control-token-file FILE");
  listenFd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listenFd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  // Loopback only: the control port is never reachable from other hosts.
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (listenFd_ < 0 ||
      bind(listenFd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 ||
      listen(listenFd_, SOMAXCONN) != 0) {
    int e = errno;
    if (listenFd_ >= 0)
      close(listenFd_);
    fail("--probe-control: cannot listen on 127.0.0.1:", port, ": ",
         std::strerror(e));
  }
  socklen_t len = sizeof addr;
  getsockname(listenFd_, reinterpret_cast<sockaddr *>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  token_ = randomToken();
  try {
    writePrivateFile(tokenFile, formatControlCredentials({port_, token_}));
  } catch (const Error &e) {
    close(listenFd_);
    fail("--probe-control: the token file: ", e.what());
  }
  tokenFile_ = tokenFile;
  thread_ = std::thread([this] { serve(); });
}

ProbeControl::~ProbeControl() {
  stop_ = true;
  if (thread_.joinable())
    thread_.join();
  if (listenFd_ >= 0)
    close(listenFd_);
  if (!tokenFile_.empty())
    ::unlink(tokenFile_.c_str()); // the token dies with the port
}

std::string ProbeControl::endpoint() const {
  return file_.empty() ? "tcp:127.0.0.1:" + std::to_string(port_)
                       : "file:" + file_;
}

void ProbeControl::log(const std::string &msg) {
  // Bounded: a client looping on bad requests cannot flood the job's log.
  constexpr int kMaxLogged = 100;
  if (logged_ < kMaxLogged)
    std::cerr << "mapp-run: probe control: " << msg << "\n";
  else if (logged_ == kMaxLogged)
    std::cerr << "mapp-run: probe control: further messages suppressed\n";
  ++logged_;
}

void ProbeControl::readFile() {
  struct stat st;
  if (stat(file_.c_str(), &st) != 0)
    return; // not written yet: nothing to apply
  // Whoever can write the file controls the job: only the user may.
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    if (!fileWarned_)
      std::cerr << "mapp-run: probe control: ignoring '" << file_
                << "': it must be owned by this user and not writable by "
                   "group or others\n";
    fileWarned_ = true;
    return;
  }
  fileWarned_ = false;
  int64_t stamp = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                  st.st_mtim.tv_nsec + st.st_size;
  if (stamp == fileStamp_)
    return;
  fileStamp_ = stamp;
  // Bounded read: a control file is a few switches, not megabytes (and
  // O_NONBLOCK: a FIFO planted at the path cannot stall the job).
  std::string text;
  int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && text.size() < (1u << 20))
    text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  json j = json::parse(text, nullptr, false);
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
      std::string why = validate_(c);
      if (why.empty())
        pending_.push_back(c);
      else
        std::cerr << "mapp-run: probe control: " << file_ << ": " << why
                  << "\n";
    } catch (const Error &err) {
      std::cerr << "mapp-run: probe control: " << file_ << ": " << err.what()
                << "\n";
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

std::string ProbeControl::answer(const std::string &line,
                                 const std::string &peer) {
  json reply;
  try {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      fail("not a JSON object");
    if (!j.contains("token") || !j["token"].is_string() ||
        !tokensEqual(j["token"].get<std::string>(), token_)) {
      log("refused a request from " + peer + " without the right token");
      return json({{"ok", false},
                   {"error", "unauthorized: the request needs the token "
                             "from the job's control token file"}})
                 .dump() +
             "\n";
    }
    j.erase("token");
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
  return reply.dump() + "\n";
}

void ProbeControl::serve() {
  // One request line per connection, answered from the gate's own loop
  // (the answer is a token check and a queue push): RequestGate.h.
  GateLimits limits;
  limits.headMs = kRequestMs;
  limits.maxHeadBytes = kMaxRequest;
  limits.maxWaiting = kMaxWaiting;
  RequestGate::Handlers h;
  h.headLength = [](const std::string &in, bool closed) -> size_t {
    size_t nl = in.find('\n');
    if (nl != std::string::npos)
      return nl + 1;
    return closed ? in.size() : 0; // closed its side: answer what it sent
  };
  h.onRequest = [this](int, std::string in, const std::string &peer) {
    return std::optional<std::string>(
        answer(in.substr(0, in.find('\n')), peer));
  };
  h.onDrop = [this](GateDrop kind, const std::string &peer,
                    const std::string &why) -> std::string {
    if (kind == GateDrop::Left)
      return ""; // connected and left: nothing to log
    log("dropped client " + peer + ": " + why);
    if (kind == GateDrop::TooLarge)
      return json({{"ok", false}, {"error", "request line too long"}}).dump() +
             "\n";
    if (kind == GateDrop::Evicted)
      return json({{"ok", false},
                   {"error", "too many connections waiting: send the "
                             "request line at once"}})
                 .dump() +
             "\n";
    return "";
  };
  RequestGate(listenFd_, limits, std::move(h)).run(stop_);
}

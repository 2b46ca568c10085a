//===- ProbeControl.cpp - control file and loopback socket ----------------===//
#include "mapp/rt/ProbeControl.h"
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <iostream>
#include <memory>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::rt;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

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
      listen(listenFd_, 16) != 0) {
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

struct ProbeControl::Client {
  int fd = -1;
  std::string peer, in, out;
  size_t sent = 0;
  bool answered = false;
  Clock::time_point deadline;
  ~Client() {
    if (fd >= 0)
      ::close(fd);
  }
};

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
  std::vector<std::unique_ptr<Client>> clients;
  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back({listenFd_, POLLIN, 0});
    for (auto &c : clients)
      fds.push_back(
          {c->fd, static_cast<short>(c->answered ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR)
      break;
    Clock::time_point now = Clock::now();
    // Serve the connections we have before taking new ones.
    for (size_t i = 0; i < clients.size(); ++i) {
      Client &c = *clients[i];
      short ev = fds[i + 1].revents;
      std::string drop; // why this client goes, "" = keep, "done" = served
      if (!c.answered && (ev & (POLLIN | POLLHUP | POLLERR))) {
        char buf[1024];
        ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          // nothing yet
        } else if (n < 0) {
          drop = std::string("connection error before a full request (") +
                 std::strerror(errno) + ")";
        } else if (c.in.empty()) {
          drop = "done"; // connected and left: nothing to log
        }
        // n == 0 with data: the client closed its side; answer what it sent.
        size_t nl = c.in.find('\n');
        if (drop.empty() && (nl != std::string::npos || n == 0)) {
          c.out = answer(c.in.substr(0, nl), c.peer);
          c.answered = true;
        } else if (drop.empty() && c.in.size() > kMaxRequest) {
          c.out = json({{"ok", false}, {"error", "request line too long"}})
                      .dump() +
                  "\n";
          c.answered = true;
          log("request from " + c.peer + " longer than " +
              std::to_string(kMaxRequest) + " bytes");
        }
      }
      if (drop.empty() && c.answered && c.sent < c.out.size()) {
        ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
          c.sent += static_cast<size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
          drop = std::string("connection error while answering (") +
                 std::strerror(errno) + ")";
      }
      if (drop.empty() && c.answered && c.sent == c.out.size())
        drop = "done";
      if (drop.empty() && now > c.deadline)
        drop = "timed out after " + std::to_string(kRequestMs) + " ms";
      if (!drop.empty()) {
        if (drop != "done")
          log("dropped client " + c.peer + ": " + drop);
        clients[i].reset();
      }
    }
    clients.erase(std::remove(clients.begin(), clients.end(), nullptr),
                  clients.end());
    if (fds[0].revents & POLLIN) {
      sockaddr_in a{};
      socklen_t len = sizeof a;
      int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr *>(&a), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        auto c = std::make_unique<Client>();
        c->fd = fd;
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
        c->peer = std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
        c->deadline = now + std::chrono::milliseconds(kRequestMs);
        if (clients.size() >= static_cast<size_t>(kMaxClients))
          log("refused client " + c->peer + ": " +
              std::to_string(kMaxClients) + " connections already open");
        else
          clients.push_back(std::move(c));
      }
    }
  }
}

//===- ScopeControl.cpp - token-checked forwarding to a running job -------===//
#include "ScopeControl.h"
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;

namespace {

constexpr const char *kTcpPrefix = "tcp:127.0.0.1:";
constexpr int kReplyMs = 3000;

/// One request line to 127.0.0.1:port, the reply line back within kReplyMs.
std::string requestReply(int port, const std::string &line) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a)) {
    if (fd >= 0)
      close(fd);
    fail("the job's control port ", port, " does not answer (job ended?)");
  }
  std::string msg = line + "\n";
  size_t off = 0;
  while (off < msg.size()) {
    ssize_t n = send(fd, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      fail("the job's control port ", port, " closed the connection");
    }
    off += static_cast<size_t>(n);
  }
  std::string reply;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kReplyMs);
  char buf[4096];
  while (reply.find('\n') == std::string::npos && reply.size() < (4u << 20)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0)
      break;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

int endpointPort(const std::string &endpoint) {
  std::string p = endpoint.substr(std::string(kTcpPrefix).size());
  return mapp::rt::parsePort("the run's control endpoint", p);
}

} // namespace

std::string ControlClient::ask(const std::string &endpoint,
                               const std::string &request,
                               bool needReply) const {
  int port = endpointPort(endpoint);
  if (opts_.tokenFile.empty())
    fail("no control token file: give --control-token-file FILE (mapp-run "
         "writes it, default: beside the probe db)");
  mapp::rt::ControlCredentials cred =
      mapp::rt::readControlCredentials(opts_.tokenFile);
  // The store names the port only to tell the runs apart: the credentials
  // decide where a command goes.
  if (cred.port != port)
    fail("this run's job listened on port ", port, ", but the token file '",
         opts_.tokenFile, "' belongs to the job on port ", cred.port,
         " (the run has ended?)");
  json req = json::parse(request);
  req["token"] = cred.token;
  std::string text = requestReply(port, req.dump());
  json reply = json::parse(text, nullptr, false);
  if (reply.is_discarded() || !reply.is_object()) {
    if (needReply)
      fail("the job gave no answer");
    return "null";
  }
  return reply.dump();
}

std::string ControlClient::set(const std::string &endpoint,
                               const mapp::rt::SwitchCommand &c) const {
  json clean = {{"switch", c.id}};
  if (c.enabled)
    clean["enabled"] = *c.enabled;
  if (c.magnitude)
    clean["magnitude"] = *c.magnitude;
  if (endpoint.rfind(kTcpPrefix, 0) == 0) {
    clean["op"] = "set";
    return ask(endpoint, clean.dump(), true);
  }
  if (endpoint.rfind("file:", 0) == 0) {
    if (opts_.controlFile.empty())
      fail("this run takes switch changes from a control file; mapp-scope "
           "writes one only when started with --control-file FILE (the store "
           "does not choose files)");
    const std::string &path = opts_.controlFile;
    json state = json::object();
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
      std::string text;
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0 && text.size() < (1u << 20))
        text.append(buf, static_cast<size_t>(n));
      close(fd);
      state = json::parse(text, nullptr, false);
    }
    if (state.is_discarded() || !state.is_object())
      state = json::object();
    if (!state.contains("switches") || !state["switches"].is_array())
      state["switches"] = json::array();
    bool found = false;
    for (json &e : state["switches"])
      if (e.is_object() && e.value("id", int64_t(-1)) == c.id) {
        for (auto &[k, v] : clean.items())
          if (k != "switch")
            e[k] = v;
        found = true;
      }
    if (!found) {
      json e = clean;
      e.erase("switch");
      e["id"] = c.id;
      state["switches"].push_back(e);
    }
    mapp::rt::replaceFileAtomically(path, state.dump() + "\n");
    return json({{"ok", true}}).dump();
  }
  fail("this run has no control endpoint (start mapp-run with "
       "--probe-control FILE|PORT)");
}

std::string ControlClient::state(const std::string &endpoint) const {
  if (endpoint.rfind(kTcpPrefix, 0) != 0 || opts_.tokenFile.empty())
    return "null";
  try {
    return ask(endpoint, "{\"op\":\"state\"}", false);
  } catch (const mapp::rt::Error &) {
    return "null"; // the job has ended: the view shows stored data only
  }
}

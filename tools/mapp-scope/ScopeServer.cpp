//===- ScopeServer.cpp - cpp-httplib glue, static files -------------------===//
#include "ScopeServer.h"
#include "ScopeGuard.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RequestGate.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kMaxStaticBytes = 64u << 20;
// With a charset parameter cpp-httplib does not compress the API's JSON:
// its brotli runs at quality 11, seconds for a long run's series on a busy
// machine, while a loopback client gains nothing from compression.
constexpr const char *kJson = "application/json; charset=utf-8";

std::string errorBody(const std::string &msg) {
  return json({{"error", msg}})
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

const char *contentTypeOf(const std::string &file) {
  static const std::pair<const char *, const char *> types[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".json", kJson},
      {".map", kJson},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".woff2", "font/woff2"},
      {".txt", "text/plain; charset=utf-8"}};
  for (const auto &[ext, type] : types) {
    size_t n = std::strlen(ext);
    if (file.size() >= n && file.compare(file.size() - n, n, ext) == 0)
      return type;
  }
  return "application/octet-stream";
}

bool readRegularFile(const std::string &path, std::string &out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            static_cast<size_t>(st.st_size) <= kMaxStaticBytes;
  if (ok) {
    out.assign(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < out.size()) {
      ssize_t n = ::read(fd, &out[got], out.size() - got);
      if (n <= 0)
        break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
  }
  ::close(fd);
  return ok;
}

void reply(httplib::Response &res, int status, const std::string &body,
           const char *type = kJson) {
  res.status = status;
  res.set_content(body, type);
}

/// A whole answer the gate sends itself (before cpp-httplib sees the
/// connection), then closes.
std::string rawReply(int status, const char *reason, const std::string &msg) {
  std::string body = errorBody(msg);
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: " + kJson +
         "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\nCache-Control: no-store\r\n"
         "X-Content-Type-Options: nosniff\r\n\r\n" +
         body;
}

/// Waits until `fd` is ready for `events`, at most `ms` (<= 0: only looks).
bool waitFor(int fd, short events, long long ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int n =
        ::poll(&p, 1, static_cast<int>(std::clamp<long long>(ms, 0, INT_MAX)));
    if (n >= 0 || errno != EINTR)
      return n > 0;
  }
}

long long msUntil(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now())
      .count();
}

void socketAddress(int fd, bool peer, std::string &ip, int &port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ip.clear();
  port = 0;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
  char buf[INET6_ADDRSTRLEN] = "";
  if (rc == 0 && a.ss_family == AF_INET) {
    auto *v4 = reinterpret_cast<sockaddr_in *>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (rc == 0 && a.ss_family == AF_INET6) {
    auto *v6 = reinterpret_cast<sockaddr_in6 *>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

/// cpp-httplib's view of a connection the gate hands over: the bytes the
/// gate read (the head, maybe part of the body) first, then the socket
/// until the body's deadline (a total, like the head's: a trickled body
/// cannot keep a worker), and each send within the write timeout.
class GatedStream final : public httplib::Stream {
public:
  GatedStream(int fd, std::string in, Clock::time_point readUntil,
              int writeMs)
      : fd_(fd), in_(std::move(in)), readUntil_(readUntil),
        writeMs_(writeMs) {}

  bool is_readable() const override {
    return pos_ < in_.size() || waitFor(fd_, POLLIN, msUntil(readUntil_));
  }
  bool is_writable() const override {
    return waitFor(fd_, POLLOUT, writeMs_);
  }
  ssize_t read(char *ptr, size_t size) override {
    if (pos_ < in_.size()) {
      size_t n = std::min(size, in_.size() - pos_);
      std::memcpy(ptr, in_.data() + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    for (;;) {
      if (!waitFor(fd_, POLLIN, msUntil(readUntil_)))
        return -1;
      ssize_t n = ::recv(fd_, ptr, size, MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EINTR))
        return n;
    }
  }
  ssize_t write(const char *ptr, size_t size) override {
    for (;;) {
      if (!waitFor(fd_, POLLOUT, writeMs_))
        return -1;
      ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EINTR))
        return n;
    }
  }
  void get_remote_ip_and_port(std::string &ip, int &port) const override {
    socketAddress(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string &ip, int &port) const override {
    socketAddress(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

private:
  int fd_;
  std::string in_;
  size_t pos_ = 0;
  Clock::time_point readUntil_;
  int writeMs_;
};

/// cpp-httplib's parser, routing and handlers, fed by the gate: its
/// protected process_request runs on a GatedStream in our worker pool,
/// instead of its own accept loop (which hands each connection to a worker
/// before a byte has come, with an idle timeout per read: no total).
class GatedServer : public httplib::Server {
public:
  int listeningSocket() const { return svr_sock_; }

  /// One request (its head already in `in`), answered; then closes `fd`.
  void serveConnection(int fd, std::string in, Clock::time_point bodyUntil,
                       int writeMs) {
    try {
      GatedStream s(fd, std::move(in), bodyUntil, writeMs);
      bool closed = true;
      process_request(s, /*close_connection=*/true, closed, nullptr);
    } catch (...) {
      // an answer that could not be built or sent: the connection goes
    }
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
};

} // namespace

std::string mapp::scope::resolveStatic(const std::string &webDir,
                                       const std::string &path) {
  if (path.empty() || path[0] != '/')
    return "";
  std::string rel = path == "/" ? "index.html" : path.substr(1);
  // Every segment is a plain name: no "..", ".", "", hidden files,
  // backslashes or encoded bytes (cpp-httplib has decoded %2e%2e already).
  size_t pos = 0;
  while (pos <= rel.size()) {
    size_t slash = rel.find('/', pos);
    std::string seg = rel.substr(pos, slash == std::string::npos
                                          ? std::string::npos
                                          : slash - pos);
    if (seg.empty() || seg[0] == '.' ||
        seg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstu"
                              "vwxyz0123456789._-") != std::string::npos)
      return "";
    if (slash == std::string::npos)
      break;
    pos = slash + 1;
  }
  // A symlink may point anywhere: judge the resolved path, not the name.
  char root[PATH_MAX], file[PATH_MAX];
  if (!::realpath(webDir.c_str(), root) ||
      !::realpath((webDir + "/" + rel).c_str(), file))
    return "";
  std::string r = root, f = file;
  if (f.size() <= r.size() + 1 || f.compare(0, r.size() + 1, r + "/") != 0)
    return "";
  struct stat st;
  if (::stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return "";
  return f;
}

void mapp::scope::serve(ScopeApi &api, const ServeOptions &o,
                        const std::function<void(int)> &ready) {
  GatedServer svr;
  // Not cpp-httplib's default SO_REUSEPORT: no second process may bind
  // the port beside us and take half the connections.
  svr.set_socket_options([](int sock) {
    int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  });
  svr.set_payload_max_length(o.maxBodyBytes);
  svr.set_default_headers({
      {"Cache-Control", "no-store"},
      // The UI loads only its own files; no inline script, no framing.
      {"Content-Security-Policy",
       "default-src 'self'; script-src 'self'; style-src 'self'; img-src "
       "'self' data:; connect-src 'self'; object-src 'none'; base-uri "
       "'none'; frame-ancestors 'none'; form-action 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
      {"Cross-Origin-Resource-Policy", "same-origin"}});

  int port = o.port;
  if (port == 0) {
    port = svr.bind_to_any_port(o.host);
    if (port <= 0)
      fail("cannot listen on ", o.host, ":0: ", std::strerror(errno));
  } else if (!svr.bind_to_port(o.host, port)) {
    fail("cannot listen on ", o.host, ":", port, ": ", std::strerror(errno));
  }
  // cpp-httplib listens with a backlog of 5: in a burst of connects the
  // kernel would drop the rest's SYNs, and a client retries after 1 s.
  ::listen(svr.listeningSocket(), SOMAXCONN);
  RequestGuard guard(o.host, port, o.token, o.ratePerSecond, o.maxBodyBytes,
                     o.maxHeaderBytes);

  svr.set_pre_routing_handler([&](const httplib::Request &req,
                                  httplib::Response &res) {
    size_t headerBytes = req.target.size() + req.method.size();
    for (const auto &[k, v] : req.headers)
      headerBytes += k.size() + v.size() + 4;
    GuardVerdict v = guard.check(
        req.method, req.path,
        req.has_param("token") ? req.get_param_value("token") : "",
        req.remote_addr, headerBytes,
        [&](const char *name) { return req.get_header_value(name); },
        [&](const char *name) { return req.get_header_value_count(name); });
    if (v.status) {
      if (v.status == 401)
        res.set_header("WWW-Authenticate", "Bearer");
      if (v.status == 429)
        res.set_header("Retry-After", "1");
      reply(res, v.status, errorBody(v.error));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!v.setCookie.empty())
      res.set_header("Set-Cookie", v.setCookie);
    if (v.redirectHome) {
      res.set_redirect("/", 303);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  auto apiHandler = [&](const httplib::Request &req, httplib::Response &res) {
    Request r;
    r.method = req.method;
    r.path = req.path;
    for (const auto &[k, v] : req.params)
      r.query.emplace(k, v);
    r.body = req.body;
    Response out;
    try {
      out = api.handle(r);
    } catch (const std::exception &e) {
      out = {400, "application/json", errorBody(e.what())};
    }
    reply(res, out.status, out.body); // every API answer is JSON
  };
  svr.Get("/api/.*", apiHandler);
  svr.Post("/api/.*", apiHandler);
  svr.Get(".*", [&](const httplib::Request &req, httplib::Response &res) {
    std::string f = resolveStatic(o.webDir, req.path), body;
    if (f.empty() || !readRegularFile(f, body))
      return reply(res, 404, errorBody("not found"));
    reply(res, 200, body, contentTypeOf(f));
  });
  svr.set_error_handler([](const httplib::Request &, httplib::Response &res) {
    if (res.body.empty())
      reply(res, res.status,
            errorBody(res.status == 413   ? "request too large"
                      : res.status == 404 ? "not found"
                                          : "bad request"));
  });
  svr.set_exception_handler(
      [](const httplib::Request &, httplib::Response &res,
         std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception &e) {
          what = e.what();
        } catch (...) {
        }
        reply(res, 500, errorBody(what));
      });

  // Complete heads go to the workers; at most maxQueued wait or run there
  // (past that: 503), which with maxWaiting also bounds the open sockets.
  std::atomic<size_t> inFlight{0};
  httplib::ThreadPool pool(static_cast<size_t>(o.threads));
  struct JoinAtExit { // before what the jobs use goes
    httplib::ThreadPool &p;
    ~JoinAtExit() { p.shutdown(); }
  } join{pool};
  mapp::rt::GateLimits limits;
  limits.headMs = o.headTimeoutMs;
  limits.maxHeadBytes = o.maxHeadBytes;
  limits.maxWaiting = o.maxWaiting;
  mapp::rt::RequestGate::Handlers h;
  h.headLength = [](const std::string &in, bool) -> size_t {
    // cpp-httplib's end of the head: the first bare CRLF line after the
    // request line (its header lines may end in LF alone).
    size_t end = in.find("\n\r\n");
    return end == std::string::npos ? 0 : end + 3;
  };
  h.onRequest = [&](int fd, std::string in,
                    const std::string &) -> std::optional<std::string> {
    if (inFlight >= o.maxQueued)
      return rawReply(503, "Service Unavailable",
                      "the server is busy: " + std::to_string(o.maxQueued) +
                          " requests in progress");
    ++inFlight;
    Clock::time_point bodyUntil =
        Clock::now() + std::chrono::milliseconds(o.bodyTimeoutMs);
    pool.enqueue([&svr, &inFlight, fd, in = std::move(in), bodyUntil,
                  writeMs = o.writeTimeoutMs]() mutable {
      svr.serveConnection(fd, std::move(in), bodyUntil, writeMs);
      --inFlight;
    });
    return std::nullopt;
  };
  h.onDrop = [&](mapp::rt::GateDrop kind, const std::string &,
                 const std::string &) -> std::string {
    switch (kind) {
    case mapp::rt::GateDrop::TimedOut:
      return rawReply(408, "Request Timeout",
                      "the request head did not arrive within " +
                          std::to_string(o.headTimeoutMs) + " ms");
    case mapp::rt::GateDrop::TooLarge:
      return rawReply(413, "Payload Too Large",
                      "request head larger than " +
                          std::to_string(o.maxHeadBytes) + " bytes");
    case mapp::rt::GateDrop::Evicted:
      return rawReply(503, "Service Unavailable",
                      "too many connections waiting for their request head");
    default:
      // Left, Failed, Idle: nothing to answer. An idle connection is a
      // browser's preconnect as often as an attack: closed silently, as
      // browsers expect of an idle socket.
      return "";
    }
  };
  ready(port);
  std::atomic<bool> stop{false};
  mapp::rt::RequestGate(svr.listeningSocket(), limits, std::move(h)).run(stop);
  fail("the server stopped: ", std::strerror(errno));
}

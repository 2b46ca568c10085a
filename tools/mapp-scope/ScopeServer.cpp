//===- ScopeServer.cpp - cpp-httplib glue, static files -------------------===//
#include "ScopeServer.h"
#include "ScopeGuard.h"
#include "mapp/rt/Error.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::scope;
using mapp::rt::fail;
using json = nlohmann::json;

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
  httplib::Server svr;
  int threads = o.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // Not cpp-httplib's default SO_REUSEPORT: no second process may bind
  // the port beside us and take half the connections.
  svr.set_socket_options([](int sock) {
    int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  });
  svr.set_read_timeout(o.readTimeoutSeconds, 0);
  svr.set_write_timeout(5, 0);
  svr.set_keep_alive_max_count(1); // one request per connection
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
        [&](const char *name) { return req.get_header_value(name); });
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
  ready(port);
  if (!svr.listen_after_bind())
    fail("the server stopped: ", std::strerror(errno));
}

//===- HttpServer.h - a minimal loopback HTTP/1.1 server --------*- C++ -*-===//
//
// One request per connection (Connection: close), handled in order on one
// thread: the UI issues a handful of small requests per refresh, and a
// single thread keeps the SQLite reads trivially safe. Headers are capped at
// 16 KiB and bodies at 64 KiB; anything else gets a 4xx.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_HTTPSERVER_H
#define MAPP_SCOPE_HTTPSERVER_H

#include <functional>
#include <map>
#include <string>

namespace mapp::scope {

struct Request {
  std::string method, path;
  std::map<std::string, std::string> query;
  std::string body;
};

struct Response {
  int status = 200;
  std::string contentType = "application/json";
  std::string body;
};

using Handler = std::function<Response(const Request &)>;

/// Splits "a=1&b=x%20y" into decoded pairs.
std::map<std::string, std::string> parseQuery(const std::string &q);

/// Binds host:port (port 0 = any free one) and returns the bound port.
int listenOn(const std::string &host, int port, int &fd);
/// Serves until the process is killed.
void serve(int fd, const Handler &h);

} // namespace mapp::scope

#endif

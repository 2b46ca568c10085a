//===- ScopeServer.h - mapp-scope's HTTP server (cpp-httplib) ---*- C++ -*-===//
//
// cpp-httplib (Debian's libcpp-httplib-dev) parses HTTP and runs a thread
// pool, so a slow client holds one worker, never the others. In front of
// the API, every request passes RequestGuard (ScopeGuard.h): rate limit,
// size limits, Host and Origin, and the access token. Static files come
// from one folder only (resolveStatic).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPESERVER_H
#define MAPP_SCOPE_SCOPESERVER_H

#include "ScopeApi.h"

#include <functional>
#include <string>

namespace mapp::scope {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8765;
  std::string webDir;
  std::string token;        // the access token (randomToken())
  double ratePerSecond = 50; // per client; 0 = no limit
  size_t maxBodyBytes = 64 << 10;
  size_t maxHeaderBytes = 16 << 10;
  int threads = 16;
  int readTimeoutSeconds = 3;
};

/// Binds, calls `ready(boundPort)`, then serves until the process ends.
/// Error when the address cannot be bound.
void serve(ScopeApi &api, const ServeOptions &o,
           const std::function<void(int)> &ready);

/// The file under `webDir` that URL path `path` names, or "" (a 404): only
/// segments of [A-Za-z0-9._-] not starting with '.', and the resolved file
/// (symlinks followed) must lie inside webDir and be a regular file.
std::string resolveStatic(const std::string &webDir, const std::string &path);

} // namespace mapp::scope

#endif

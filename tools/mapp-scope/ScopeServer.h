//===- ScopeServer.h - mapp-scope's HTTP server (cpp-httplib) ---*- C++ -*-===//
//
// cpp-httplib (Debian's libcpp-httplib-dev) parses HTTP and routes; the
// connections come to it through a RequestGate (mapp/rt/RequestGate.h):
// one poll() loop holds each connection until its request head is complete,
// within a total deadline, so the worker threads only ever see complete
// heads and a client that trickles bytes holds no worker (cpp-httplib
// 0.11.4's own accept loop gives each connection a worker at once, with an
// idle timeout per read: 50 slow clients held all 16 workers, issue 43).
// In front of the API, every request passes RequestGuard (ScopeGuard.h):
// rate limit, repeated headers, size limits, Host and Origin, and the
// access token. Static files come from one folder only (resolveStatic).
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
  int headTimeoutMs = 5000;   // accept -> the end of the request head
  int bodyTimeoutMs = 10000;  // the end of the head -> the end of the body
  int writeTimeoutMs = 5000;  // each send of the answer
  size_t maxHeadBytes = 32 << 10; // on the wire, before parsing (413)
  size_t maxWaiting = 128;    // connections waiting for their head
  size_t maxQueued = 64;      // complete requests queued or being served
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

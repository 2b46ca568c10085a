//===- ScopeGuard.h - who may talk to mapp-scope ----------------*- C++ -*-===//
//
// The checks every HTTP request passes before it reaches a handler, in
// order: a per-client rate limit (429), a header the checks read given
// twice (400: kOnceOnly), size limits (413; 411 for a chunked
// body, whose size is not known before it is read), Host (403: DNS
// rebinding), Origin when present (403: cross-site requests), the access
// token (401) from `Authorization: Bearer`, the page's HttpOnly cookie, or
// `?token=` on the page's first load (which sets the cookie), and a JSON
// content type for POST (415: no form or text/plain posts).
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_SCOPE_SCOPEGUARD_H
#define MAPP_SCOPE_SCOPEGUARD_H

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace mapp::scope {

struct GuardVerdict {
  int status = 0;         // 0 = let it through
  std::string error;      // why not, for the JSON body
  std::string setCookie;  // a Set-Cookie value to send
  bool redirectHome = false; // the token came in the URL: 303 to "/"
};

class RequestGuard {
public:
  RequestGuard(std::string host, int port, std::string token,
               double ratePerSecond, size_t maxBodyBytes,
               size_t maxHeaderBytes);

  /// The headers the checks read: each may come once at most (400), so
  /// that a second `Host` or `Authorization` cannot ride behind a right
  /// first one (a proxy or a browser may pick the other).
  static constexpr const char *kOnceOnly[] = {
      "Host",         "Origin",         "Authorization",    "Cookie",
      "Content-Type", "Content-Length", "Transfer-Encoding"};

  /// `header(name)` returns a request header ("" when absent) and
  /// `count(name)` how many times it came; `headerBytes` sums the
  /// request's header lines.
  template <typename HeaderFn, typename CountFn>
  GuardVerdict check(const std::string &method, const std::string &path,
                     const std::string &queryToken, const std::string &peer,
                     size_t headerBytes, const HeaderFn &header,
                     const CountFn &count) {
    std::string repeated;
    for (const char *name : kOnceOnly)
      if (repeated.empty() && count(name) > 1)
        repeated = name;
    return checkImpl(method, path, queryToken, peer, headerBytes, repeated,
                     header("Host"), header("Origin"),
                     header("Authorization"), header("Cookie"),
                     header("Content-Type"), header("Content-Length"),
                     header("Transfer-Encoding"));
  }

  const std::string &cookieName() const { return cookie_; }

private:
  GuardVerdict checkImpl(const std::string &method, const std::string &path,
                         const std::string &queryToken,
                         const std::string &peer, size_t headerBytes,
                         const std::string &repeated,
                         const std::string &host, const std::string &origin,
                         const std::string &authorization,
                         const std::string &cookie,
                         const std::string &contentType,
                         const std::string &contentLength,
                         const std::string &transferEncoding);
  bool allowRate(const std::string &peer);

  std::set<std::string> hosts_; // "127.0.0.1:8765", "localhost:8765", ...
  std::string token_, cookie_;
  double rate_;
  size_t maxBody_, maxHeader_;
  struct Bucket {
    double tokens;
    std::chrono::steady_clock::time_point last;
  };
  std::mutex mu_;
  std::map<std::string, Bucket> buckets_;
};

} // namespace mapp::scope

#endif

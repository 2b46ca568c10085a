//===- ScopeGuard.cpp - token, Host/Origin, limits ------------------------===//
#include "ScopeGuard.h"
#include "mapp/rt/ControlFiles.h"

#include <algorithm>
#include <cctype>

using namespace mapp::scope;

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

/// The value of cookie `name` in a Cookie header ("" when absent).
std::string cookieValue(const std::string &header, const std::string &name) {
  size_t pos = 0;
  while (pos <= header.size()) {
    size_t semi = header.find(';', pos);
    std::string pair = trim(header.substr(
        pos, semi == std::string::npos ? std::string::npos : semi - pos));
    size_t eq = pair.find('=');
    if (eq != std::string::npos && pair.substr(0, eq) == name)
      return pair.substr(eq + 1);
    if (semi == std::string::npos)
      break;
    pos = semi + 1;
  }
  return "";
}

GuardVerdict deny(int status, std::string why) {
  GuardVerdict v;
  v.status = status;
  v.error = std::move(why);
  return v;
}

} // namespace

RequestGuard::RequestGuard(std::string host, int port, std::string token,
                           double ratePerSecond, size_t maxBodyBytes,
                           size_t maxHeaderBytes)
    : token_(std::move(token)), cookie_("mapp_scope_" + std::to_string(port)),
      rate_(ratePerSecond), maxBody_(maxBodyBytes), maxHeader_(maxHeaderBytes) {
  std::string p = ":" + std::to_string(port);
  for (const std::string &h : {std::string("127.0.0.1"),
                               std::string("localhost"), lower(host)}) {
    hosts_.insert(h + p);
    if (port == 80)
      hosts_.insert(h); // browsers leave the default port out
  }
}

bool RequestGuard::allowRate(const std::string &peer) {
  if (rate_ <= 0)
    return true;
  // A token bucket per client address: `rate_` requests a second, bursts
  // of twice that (a page refresh issues about ten requests at once).
  auto now = std::chrono::steady_clock::now();
  double burst = 2 * rate_;
  std::lock_guard<std::mutex> l(mu_);
  if (buckets_.size() > 4096)
    buckets_.clear(); // bounded memory whatever the peers
  auto [it, fresh] = buckets_.try_emplace(peer, Bucket{burst, now});
  Bucket &b = it->second;
  if (!fresh) {
    double dt = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst, b.tokens + dt * rate_);
    b.last = now;
  }
  if (b.tokens < 1)
    return false;
  b.tokens -= 1;
  return true;
}

GuardVerdict RequestGuard::checkImpl(
    const std::string &method, const std::string &path,
    const std::string &queryToken, const std::string &peer,
    size_t headerBytes, const std::string &repeated, const std::string &host,
    const std::string &origin,
    const std::string &authorization, const std::string &cookie,
    const std::string &contentType, const std::string &contentLength,
    const std::string &transferEncoding) {
  if (!allowRate(peer))
    return deny(429, "too many requests from " + peer + "; slow down");
  if (!repeated.empty())
    return deny(400, "more than one " + repeated + " header");
  if (headerBytes > maxHeader_)
    return deny(413, "request headers larger than " +
                         std::to_string(maxHeader_) + " bytes");
  if (!transferEncoding.empty())
    return deny(411, "chunked bodies are not accepted: send Content-Length "
                     "(at most " + std::to_string(maxBody_) + " bytes)");
  if (!contentLength.empty()) {
    if (contentLength.size() > 18 ||
        contentLength.find_first_not_of("0123456789") != std::string::npos)
      return deny(400, "bad Content-Length");
    if (std::stoull(contentLength) > maxBody_)
      return deny(413, "request body larger than " +
                           std::to_string(maxBody_) + " bytes");
  }
  // DNS rebinding: a page of evil.example resolved to 127.0.0.1 still
  // says Host: evil.example.
  if (!hosts_.count(lower(host)))
    return deny(403, "Host '" + host + "' is not this server");
  if (!origin.empty()) {
    std::string o = lower(origin);
    if (o.rfind("http://", 0) != 0 || !hosts_.count(o.substr(7)))
      return deny(403, "cross-origin request from '" + origin + "' refused");
  }

  GuardVerdict ok;
  std::string given;
  std::string auth = trim(authorization);
  if (lower(auth.substr(0, 7)) == "bearer ")
    given = trim(auth.substr(7));
  else if (!cookie.empty())
    given = cookieValue(cookie, cookie_);
  bool page = (method == "GET" || method == "HEAD") &&
              (path == "/" || path == "/index.html");
  if (given.empty() && page && !queryToken.empty()) {
    // The URL printed at start: trade it for an HttpOnly cookie and send
    // the browser to "/", so the token leaves the address bar and history.
    given = queryToken;
    ok.setCookie = cookie_ + "=" + queryToken +
                   "; HttpOnly; SameSite=Strict; Path=/";
    ok.redirectHome = true;
  }
  if (given.empty())
    return deny(401, "an access token is required: open the URL mapp-scope "
                     "printed at start, or send Authorization: Bearer TOKEN");
  if (!mapp::rt::tokensEqual(given, token_))
    return deny(401, "wrong access token");
  if (method == "POST" &&
      lower(trim(contentType.substr(0, contentType.find(';')))) !=
          "application/json")
    return deny(415, "POST bodies must be application/json");
  return ok;
}

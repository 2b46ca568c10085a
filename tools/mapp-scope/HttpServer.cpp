//===- HttpServer.cpp - minimal HTTP/1.1 over BSD sockets -----------------===//
#include "HttpServer.h"
#include "mapp/rt/Error.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace mapp::scope;
using mapp::rt::fail;

namespace {

const char *statusText(int s) {
  switch (s) {
  case 200:
    return "OK";
  case 400:
    return "Bad Request";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 413:
    return "Payload Too Large";
  case 502:
    return "Bad Gateway";
  default:
    return "Error";
  }
}

std::string decode(const std::string &s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+')
      out += ' ';
    else if (s[i] == '%' && i + 2 < s.size() && isxdigit(s[i + 1]) &&
             isxdigit(s[i + 2])) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else
      out += s[i];
  }
  return out;
}

bool readSome(int fd, std::string &buf) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) <= 0)
    return false;
  char tmp[4096];
  ssize_t n = read(fd, tmp, sizeof tmp);
  if (n <= 0)
    return false;
  buf.append(tmp, n);
  return true;
}

void writeAll(int fd, const std::string &s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n <= 0)
      return;
    off += n;
  }
}

void respond(int fd, const Response &r) {
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " +
                     statusText(r.status) + "\r\nContent-Type: " +
                     r.contentType +
                     "\r\nContent-Length: " + std::to_string(r.body.size()) +
                     "\r\nCache-Control: no-store"
                     // The UI loads only its own script and style files.
                     "\r\nContent-Security-Policy: default-src 'self'; "
                     "script-src 'self'; style-src 'self'; img-src 'self' "
                     "data:; connect-src 'self'; object-src 'none'; "
                     "base-uri 'none'; frame-ancestors 'none'"
                     "\r\nX-Content-Type-Options: nosniff"
                     "\r\nConnection: close\r\n\r\n";
  writeAll(fd, head + r.body);
}

Response error(int status, const std::string &msg) {
  Response r;
  r.status = status;
  r.body = "{\"error\":\"" + msg + "\"}";
  return r;
}

void handleConnection(int fd, const Handler &h) {
  std::string buf;
  size_t end;
  while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > 16384)
      return respond(fd, error(413, "headers too large"));
    if (!readSome(fd, buf))
      return;
  }
  std::string head = buf.substr(0, end);
  std::string body = buf.substr(end + 4);
  Request req;
  size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos)
    return respond(fd, error(400, "malformed request line"));
  req.method = head.substr(0, sp1);
  std::string target = head.substr(sp1 + 1, sp2 - sp1 - 1);
  size_t q = target.find('?');
  req.path = target.substr(0, q);
  if (q != std::string::npos)
    req.query = parseQuery(target.substr(q + 1));
  size_t length = 0;
  std::string lower = head;
  for (char &c : lower)
    c = static_cast<char>(tolower(c));
  size_t cl = lower.find("\r\ncontent-length:");
  if (cl != std::string::npos) {
    try {
      length = std::stoul(head.substr(cl + 17));
    } catch (const std::exception &) {
      return respond(fd, error(400, "bad content-length"));
    }
  }
  if (length > 65536)
    return respond(fd, error(413, "body too large"));
  while (body.size() < length)
    if (!readSome(fd, body))
      return respond(fd, error(400, "truncated body"));
  req.body = body.substr(0, length);
  Response r;
  try {
    r = h(req);
  } catch (const std::exception &e) {
    r = error(400, "bad request");
    // Messages come from our own code (no user-controlled format strings);
    // JSON-escape them through a minimal filter.
    std::string m;
    for (char c : std::string(e.what()))
      m += (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20)
               ? ' '
               : c;
    r.body = "{\"error\":\"" + m + "\"}";
  }
  respond(fd, r);
}

} // namespace

std::map<std::string, std::string>
mapp::scope::parseQuery(const std::string &q) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos <= q.size()) {
    size_t amp = q.find('&', pos);
    std::string kv = q.substr(pos, amp == std::string::npos ? std::string::npos
                                                            : amp - pos);
    size_t eq = kv.find('=');
    if (!kv.empty())
      out[decode(kv.substr(0, eq))] =
          eq == std::string::npos ? "" : decode(kv.substr(eq + 1));
    if (amp == std::string::npos)
      break;
    pos = amp + 1;
  }
  return out;
}

int mapp::scope::listenOn(const std::string &host, int port, int &fd) {
  fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    fail("--host must be an IPv4 address, got '", host, "'");
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) ||
      listen(fd, 16))
    fail("cannot listen on ", host, ":", port, ": ", std::strerror(errno));
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len);
  return ntohs(addr.sin_port);
}

void mapp::scope::serve(int fd, const Handler &h) {
  for (;;) {
    int c = accept(fd, nullptr, nullptr);
    if (c < 0)
      continue;
    handleConnection(c, h);
    close(c);
  }
}

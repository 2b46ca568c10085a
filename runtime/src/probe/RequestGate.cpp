//===- RequestGate.cpp - accept, then wait for the head under a deadline --===//
#include "mapp/rt/RequestGate.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <list>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

using namespace mapp::rt;
using Clock = std::chrono::steady_clock;

namespace {

// New connections taken per round: a flood of connects cannot starve the
// reads of connections already held, and a connection held is read again
// before maxWaiting / kAcceptsPerRound rounds of newcomers can displace it.
constexpr int kAcceptsPerRound = 16;
constexpr int kPollMs = 100;

struct Conn {
  int fd = -1;
  std::string peer, in, out;
  size_t sent = 0;
  bool answering = false; // the request came: sending `out`
  Clock::time_point deadline;
};

} // namespace

std::string mapp::rt::peerName(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0)
    return "?";
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto *v4 = reinterpret_cast<sockaddr_in *>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof ip);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto *v6 = reinterpret_cast<sockaddr_in6 *>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof ip);
    port = ntohs(v6->sin6_port);
  }
  return std::string(ip) + ":" + std::to_string(port);
}

RequestGate::RequestGate(int listenFd, GateLimits limits, Handlers handlers)
    : listenFd_(listenFd), limits_(limits), h_(std::move(handlers)) {
  // accept4 until EAGAIN each round, never blocking the loop.
  int flags = ::fcntl(listenFd_, F_GETFL);
  ::fcntl(listenFd_, F_SETFL, flags | O_NONBLOCK);
}

void RequestGate::run(const std::atomic<bool> &stop) {
  std::list<Conn> conns; // in accept order: the front is the oldest
  const std::string timedOut =
      "timed out after " + std::to_string(limits_.headMs) + " ms";

  auto drop = [&](Conn &c, GateDrop kind, const std::string &why) {
    std::string bytes = h_.onDrop(kind, c.peer, why);
    if (!bytes.empty())
      (void)::send(c.fd, bytes.data(), bytes.size(),
                   MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(c.fd);
    c.fd = -1;
  };
  auto writeTo = [&](Conn &c) {
    while (c.sent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return; // the rest when the socket has room
      } else {
        return drop(c, GateDrop::Failed,
                    std::string("connection error while answering (") +
                        std::strerror(errno) + ")");
      }
    }
    ::close(c.fd);
    c.fd = -1;
  };
  auto readFrom = [&](Conn &c) {
    bool closed = false;
    char buf[4096];
    // At most one byte past the cap: enough to know the head is too long.
    while (c.in.size() <= limits_.maxHeadBytes) {
      size_t room = limits_.maxHeadBytes + 1 - c.in.size();
      ssize_t n = ::recv(c.fd, buf, std::min(room, sizeof buf), MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        closed = true;
        break;
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else {
        return drop(c, GateDrop::Failed,
                    std::string("connection error before a full request (") +
                        std::strerror(errno) + ")");
      }
    }
    size_t head = h_.headLength(c.in, closed);
    if (head > limits_.maxHeadBytes ||
        (!head && c.in.size() > limits_.maxHeadBytes))
      return drop(c, GateDrop::TooLarge,
                  "request longer than " +
                      std::to_string(limits_.maxHeadBytes) + " bytes");
    if (head) {
      std::optional<std::string> reply =
          h_.onRequest(c.fd, std::move(c.in), c.peer);
      c.in.clear();
      if (!reply) {
        c.fd = -1; // the server took the connection
        return;
      }
      c.out = std::move(*reply);
      c.answering = true;
      return writeTo(c);
    }
    if (closed)
      drop(c, c.in.empty() ? GateDrop::Left : GateDrop::Failed,
           c.in.empty() ? "closed without a request"
                        : "closed before a full request");
  };
  auto evictOldest = [&] {
    size_t waiting = 0;
    for (const Conn &c : conns)
      waiting += c.fd >= 0 && !c.answering;
    for (Conn &c : conns) {
      if (waiting <= limits_.maxWaiting)
        break;
      if (c.fd < 0 || c.answering)
        continue;
      drop(c, GateDrop::Evicted,
           std::to_string(limits_.maxWaiting) +
               " connections were waiting for their request: the oldest "
               "goes");
      --waiting;
    }
  };

  Clock::time_point acceptPausedUntil;
  while (!stop) {
    Clock::time_point now = Clock::now();
    int timeoutMs = kPollMs;
    std::vector<pollfd> fds;
    fds.reserve(conns.size() + 1);
    // Out of file descriptors: accept again in a moment, not in a busy loop.
    bool accepting = now >= acceptPausedUntil;
    fds.push_back({listenFd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (!accepting)
      timeoutMs = 10;
    for (const Conn &c : conns) {
      fds.push_back(
          {c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      c.deadline - now)
                      .count() +
                  1;
      timeoutMs = static_cast<int>(std::clamp<long long>(left, 0, timeoutMs));
    }
    if (::poll(fds.data(), fds.size(), timeoutMs) < 0 && errno != EINTR)
      break;
    now = Clock::now();
    size_t i = 1;
    for (Conn &c : conns) {
      short ev = fds[i++].revents;
      if (ev)
        c.answering ? writeTo(c) : readFrom(c);
      if (c.fd >= 0 && now > c.deadline)
        drop(c,
             c.in.empty() && !c.answering ? GateDrop::Idle : GateDrop::TimedOut,
             timedOut);
    }
    conns.remove_if([](const Conn &c) { return c.fd < 0; });

    if (!(fds[0].revents & POLLIN))
      continue;
    for (int k = 0; k < kAcceptsPerRound; ++k) {
      int fd =
          ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED)
          continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM)
          acceptPausedUntil = now + std::chrono::milliseconds(10);
        break; // EAGAIN: the queue is empty
      }
      Conn &c = conns.emplace_back();
      c.fd = fd;
      c.peer = peerName(fd);
      c.deadline = now + std::chrono::milliseconds(limits_.headMs);
      readFrom(c); // the request has usually come with the connection
      if (c.fd < 0)
        conns.pop_back();
    }
    evictOldest();
    conns.remove_if([](const Conn &c) { return c.fd < 0; });
  }
  for (Conn &c : conns)
    ::close(c.fd);
}
